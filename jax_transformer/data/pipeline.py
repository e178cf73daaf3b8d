"""Grain input pipelines: data source -> tokens -> fixed-shape batches.

The trainer calls ``make_iterator`` once per split and ``global_batch`` on
every local batch it draws::

  prepared = prepare('ding_en_de', data_dir)            # once, one process
  it = make_iterator(data_cfg, 'train', prepared.tokenizer,
                     batch_size=256, seq_len=64, seed=0)
  state = it.get_state()   # store in the checkpoint; it.set_state(state) to
                           # resume at exactly the next batch
  batch = global_batch(next(it), mesh)                   # jax.Arrays, sharded

Properties:

* Deterministic: the same seed gives the same batches (shuffling is Grain's
  index shuffle, reshuffled every epoch; packing is in order).
* Per host: process i of n reads every n-th example (or window) of the split
  and builds a local batch of ``batch_size // n`` rows; ``global_batch`` puts
  the local batches together along the batch dimension.
* Resumable: ``get_state()``/``set_state()`` of the returned iterator round
  trip (a small dict, JSON-serialisable), also through packing.
* Evaluation (``shuffle=False`` and ``num_epochs=1``) sees every example once,
  truncated rather than dropped, never packed, and every host yields the same
  number of batches: the last ones are filled with empty rows (segment 0,
  weight 0). Training drops translation pairs longer than the rows (a cut
  target would lose its EOS) and truncates LM sentences.
* Mixtures: with ``data.mixture``, training rows come from several sources
  in the proportions of their weights (``mixture``).
* Fast where it matters: decoding a TFDS record costs ~0.2 ms of Python, so
  splits of up to ``cache_limit`` examples (ding_en_de, the WMT dev/test sets,
  Shakespeare's stream) are read and tokenized once into memory; bigger ones
  (WMT train, lm1b) are read lazily by ``num_threads`` threads, in chunks of
  examples so that Grain's per-element cost is paid once per chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import grain
import jax
import numpy as np
from absl import flags
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.data import (
  batching,
  files,
  mixture,
  preflight,
  token_store,
  workers,
)
from jax_transformer.data.datasets import (
  DatasetSpec,
  as_text,
  default_data_dir,
  given_tokenizer,
  load_source,
  spec_for,
)
from jax_transformer.data.tokenizers import ByteTokenizer, Tokenizer
from jax_transformer.errors import UsageError
from jax_transformer.experiment.data import DataConfig

DIRECTIONS = ('en-de', 'de-en')


def check_config(data_cfg: Any) -> None:
  """Refuses in one sentence, before anything is prepared, a data config
  that names nothing it could read: its own fields, the dataset (a
  'files' glob that matches nothing, a task misspelt), its mixture
  (weights, labels, one task) and its tokenizer_path."""
  d = DataConfig.of(data_cfg)
  d.check()
  spec_for(d)
  mixture.check(d)
  given_tokenizer(d)


def translation_keys(spec: DatasetSpec, direction: str | None
                     ) -> tuple[str, str]:
  """(source feature, target feature) for 'en-de' / 'de-en' (any
  'src-tgt' of the dataset's two languages)."""
  directions = ('-'.join(spec.languages), '-'.join(spec.languages[::-1]))
  if direction not in directions:
    raise UsageError(f"{spec.name} is a translation dataset: set direction to "
                     f"one of {directions} (source-target), got {direction!r}")
  src, tgt = direction.split('-')
  if {src, tgt} != set(spec.languages):
    raise UsageError(f'{spec.name} has languages {spec.languages}; direction '
                     f'{direction!r} does not match them.')
  return src, tgt


def _local_batch_size(batch_size: int, process_count: int) -> int:
  if batch_size % process_count:
    raise UsageError(f'Global batch size {batch_size} is not divisible by '
                     f'the {process_count} processes.')
  return batch_size // process_count


def _padded_length(n_global: int, process_count: int,
                   local_batch: int) -> int:
  """Examples per host so that all hosts run the same number of full batches."""
  per_host = -(-n_global // process_count)  # the largest shard
  return -(-per_host // local_batch) * local_batch


def _order(ds: grain.MapDataset, *, seed: int, shuffle: bool,
           num_epochs: int | None) -> grain.MapDataset:
  # Shuffling before repeat makes Grain reshuffle each epoch (seed + epoch).
  if shuffle:
    ds = ds.shuffle(seed=seed)
  if num_epochs != 1:
    ds = ds.repeat(num_epochs)
  return ds


def _fill_to(ds: grain.MapDataset, length: int, filler: Any
             ) -> grain.MapDataset:
  """ds followed by copies of filler up to length elements."""
  n = len(ds)
  return grain.MapDataset.range(length).map(
      lambda i: ds[i] if i < n else filler)


def stream_tokens(source, spec: DatasetSpec, tokenizer: Tokenizer
                  ) -> np.ndarray:
  """The split as one token stream [N], examples in stored order.

  Examples are joined with spec.stream_separator (or EOS when None), so the
  stream of a play is the play's text.
  """
  pieces = []
  sep = (None if spec.stream_separator is None
         else tokenizer.encode(spec.stream_separator))
  for i in range(len(source)):
    if i:
      pieces.append([batching.markers(tokenizer)[1]] if sep is None else sep)
    pieces.append(tokenizer.encode(as_text(source[i][spec.text_key])))
  flat = [t for p in pieces for t in p]
  return np.asarray(flat, dtype=np.int32)


def stored_stream(store, spec: DatasetSpec, tokenizer: Tokenizer
                  ) -> np.ndarray:
  """``stream_tokens`` from a token store: the same ids, nothing decoded."""
  ids, offsets = store.ids(spec.text_key), store.offsets(spec.text_key)
  sep = np.asarray([batching.markers(tokenizer)[1]]
                   if spec.stream_separator is None
                   else tokenizer.encode(spec.stream_separator), np.int32)
  n = len(offsets) - 1
  if n < 1:
    return np.zeros(0, np.int32)
  # The separator before every example but the first, in one vectorized
  # insert (a Python loop costs seconds per million documents).
  at = np.repeat(offsets[1:-1], len(sep))
  return np.insert(np.asarray(ids[offsets[0]:offsets[-1]], np.int32),
                   at - offsets[0], np.tile(sep, n - 1))


def _stream_length(store, spec: DatasetSpec, tokenizer: Tokenizer) -> int:
  """len(stored_stream(...)), without building the stream."""
  offsets = store.offsets(spec.text_key)
  n = len(offsets) - 1
  sep = (1 if spec.stream_separator is None
         else len(tokenizer.encode(spec.stream_separator)))
  return int(offsets[-1] - offsets[0]) + max(n - 1, 0) * sep


def _lm_stream_dataset(tokens, spec, *, seq_len, local_batch,
                       seed, shuffle, num_epochs, process_index,
                       process_count, evaluation) -> grain.MapDataset:
  n = batching.num_lm_windows(len(tokens), seq_len)
  if n == 0:
    raise UsageError(f'{spec.name} has {len(tokens)} tokens: too few for one '
                     f'window of {seq_len + 1}.')
  ds = grain.MapDataset.range(n)[process_index::process_count]
  if evaluation:
    ds = _fill_to(ds, _padded_length(n, process_count, local_batch),
                  -1)
  else:
    ds = _order(ds, seed=seed, shuffle=shuffle, num_epochs=num_epochs)
  empty = {k: np.zeros((seq_len,), np.int32)
           for k in batching.batch_keys(batching.lm_layout(seq_len))}
  ds = ds.map(lambda i: empty if i < 0
              else batching.lm_window(tokens, i, seq_len))
  # Training batches must be full; evaluation was filled to whole batches.
  return ds.batch(local_batch, drop_remainder=True)


def is_instruction(spec: DatasetSpec) -> bool:
  """Instruction data (direction 'prompt-completion', see data/files.py):
  a decoder LM's rows, trained on the completion only."""
  return spec.task == 'translation' and files.is_instruction(spec.languages)


def _example_fn(spec: DatasetSpec, cfg: DataConfig, tokenizer: Tokenizer):
  """Raw TFDS example -> token example (see batching)."""
  stored = _stored_example_fn(spec, cfg, tokenizer)
  keys = spec.text_features
  return lambda ex: stored({k: tokenizer.encode(as_text(ex[k])) for k in keys})


def _stored_example_fn(spec: DatasetSpec, cfg: DataConfig,
                       tokenizer: Tokenizer):
  """Token store example ({feature: ids}) -> token example, framed with
  the tokenizer's BOS and EOS (``batching.markers``)."""
  bos, eos = batching.markers(tokenizer)
  if spec.task == 'lm':
    return lambda ex: batching.lm_example(ex[spec.text_key], bos, eos)
  if is_instruction(spec):
    last_only = cfg.chat_train == 'last'
    return lambda ex: batching.instruction_example(
        ex['prompt'], ex['completion'], bos, eos, last_only=last_only)
  src_key, tgt_key = translation_keys(spec, cfg.direction)
  return lambda ex: batching.translation_example(ex[src_key], ex[tgt_key],
                                                 bos, eos)


def make_dataset(data_cfg: Any, split: str, tokenizer: Tokenizer, *,
                 batch_size: int, seq_len: int, seed: int = 0,
                 shuffle: bool = True, num_epochs: int | None = None,
                 process_index: int | None = None,
                 process_count: int | None = None,
                 num_threads: int = 4,
                 cache_limit: int = 200_000,
                 source=None) -> grain.IterDataset:
  """The batches of one split as a grain IterDataset (see module doc).

  Args:
    data_cfg: a DataConfig, or anything ``DataConfig.of`` accepts.
    split: TFDS split name ('train', 'validation', 'test').
    tokenizer: from ``prepare(...).tokenizer`` or ``load_tokenizer``.
    batch_size: the global batch size B; each process gets B // processes.
    seq_len: T, the length of every row (the target side for translation).
    seed: shuffling seed.
    shuffle: shuffle examples (each epoch differently).
    num_epochs: passes over the data; None repeats forever.
    process_index / process_count: this host and the number of hosts
      (default: jax.process_index() / jax.process_count()).
    num_threads: threads reading and tokenizing ahead of the consumer.
    cache_limit: splits with at most this many examples are read and
      tokenized once, into memory (ding_en_de, WMT validation sets); larger
      ones are read lazily by the threads.
    source: a data source of text to read instead of the prepared TFDS
      split and its token store (tests).

  Returns:
    An IterDataset of dicts of int32 numpy arrays [B // processes, T] (and
    [.., S] for the source side), formats in ``batching``.
  """
  cfg = DataConfig.of(data_cfg)
  spec = spec_for(data_cfg)
  if process_index is None or process_count is None:
    process_index, process_count = jax.process_index(), jax.process_count()
  local_batch = _local_batch_size(batch_size, process_count)
  evaluation = not shuffle and num_epochs == 1
  if not evaluation and mixture.sources(data_cfg):  # see data/mixture.py
    return mixture.mixed_dataset(
        data_cfg, functools.partial(make_dataset, tokenizer=tokenizer),
        batch_size=batch_size, seed=seed, process_count=process_count,
        seq_len=seq_len, shuffle=shuffle, num_epochs=num_epochs,
        process_index=process_index, num_threads=num_threads,
        cache_limit=cache_limit, source=source)
  store = None
  if source is None:  # token ids, written once per tokenizer
    store = token_store.open_or_build(
        cfg.data_dir or default_data_dir(), spec.home, split, tokenizer,
        spec.text_features,
        lambda: load_source(spec, split, cfg.data_dir))
  # In memory (streams, cached splits) a batch is a few numpy copies: no
  # threads. Otherwise threads read chunks of 64 examples ahead.
  in_memory = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  read_options = grain.ReadOptions(
      num_threads=num_threads, prefetch_buffer_size=max(16, 4 * num_threads))

  if spec.task == 'lm' and spec.lm_mode == 'stream':
    tokens = (stream_tokens(source, spec, tokenizer) if store is None
              else stored_stream(store, spec, tokenizer))
    ds = _lm_stream_dataset(
        tokens, spec, seq_len=seq_len, local_batch=local_batch,
        seed=seed, shuffle=shuffle, num_epochs=num_epochs,
        process_index=process_index, process_count=process_count,
        evaluation=evaluation)
    return ds.to_iter_dataset(in_memory)

  layout = _layout(spec, cfg, seq_len)
  n_global = len(source if store is None else store)
  # Training reads forever: a whole pass of this host's examples dropped
  # twice over means none fits, refused rather than read on.
  pass_length = len(range(n_global)[process_index::process_count])
  guard = dict(pass_length=pass_length, refusal=functools.partial(
      _iterator_refusal, training_rows(data_cfg, seq_len=seq_len,
                                       batch_size=batch_size),
      f'{split}{" on this host" if process_count > 1 else ""}',
      pass_length))
  if store is not None and not evaluation:
    return _stored_training_batches(
        store, spec, cfg, layout, local_batch, seed=seed, shuffle=shuffle,
        num_epochs=num_epochs, process_index=process_index,
        process_count=process_count, tokenizer=tokenizer, guard=guard)
  ds = grain.MapDataset.source(source if store is None else store)
  ds = ds[process_index::process_count].map(
      _example_fn(spec, cfg, tokenizer) if store is None
      else _stored_example_fn(spec, cfg, tokenizer))
  if n_global <= cache_limit:
    # Decoding one TFDS record costs ~0.2 ms of Python, far more than
    # tokenizing it: read a small split once, keep its token ids in memory,
    # and let the consumer thread do the rest.
    ds = grain.MapDataset.source([ds[i] for i in range(len(ds))])
    read_options = in_memory
  if evaluation:
    # Keep every example (cut to length), then fill every host's shard to the
    # same whole number of batches with empty examples.
    ds = ds.map(lambda ex: batching.truncate(ex, layout))
    ds = _fill_to(ds, _padded_length(n_global, process_count, local_batch),
                  batching.empty_example(layout))
  else:
    ds = _order(ds, seed=seed, shuffle=shuffle, num_epochs=num_epochs)
    ds = ds.map(_training_fit(spec, layout))
  return batching.pack_and_batch(ds, layout, local_batch,
                                 pack=cfg.pack and not evaluation,
                                 read_options=read_options,
                                 **({} if evaluation else guard))


def _layout(spec: DatasetSpec, cfg: DataConfig, seq_len: int
            ) -> batching.Layout:
  return (batching.lm_layout(seq_len) if spec.task == 'lm' else
          batching.instruction_layout(seq_len) if is_instruction(spec) else
          batching.translation_layout(cfg.src_len or seq_len, seq_len))


def _training_fit(spec: DatasetSpec, layout):
  """example -> what training keeps of it: an LM sentence cut to the row
  (still good text), a translation pair whole or ``batching.Dropped`` (a
  cut target would teach the decoder never to emit EOS; a MapDataset
  cannot be chunked after .filter, so Dropped marks a dropped pair)."""
  if spec.task == 'lm' or is_instruction(spec):
    return lambda ex: batching.truncate(ex, layout)
  return lambda ex: (ex if batching.fits(ex, layout)
                     else batching.dropped(ex, layout))


def _iterator_refusal(rows: preflight.Rows, where: str, pass_length: int,
                      lengths: np.ndarray) -> str:
  """The training iterator's refusal after a whole pass dropped twice
  (the pre-flight's sentence, for a share of the data its sample
  missed)."""
  read = f'a whole pass of the {pass_length:,} {rows.what}s of {where}'
  if len(lengths) < pass_length:
    read += f' (the first {len(lengths):,} measured)'
  return preflight.refusal(rows, lengths, read)


def training_rows(data_cfg: Any, *, seq_len: int, batch_size: int
                  ) -> preflight.Rows | None:
  """What a training example of data_cfg becomes in rows of seq_len
  (``preflight.Rows``); None for a stream language model (windows)."""
  cfg = DataConfig.of(data_cfg)
  spec = spec_for(data_cfg)
  if spec.task == 'lm' and spec.lm_mode == 'stream':
    return None
  layout = _layout(spec, cfg, seq_len)
  rows = functools.partial(preflight.Rows, layout=layout,
                           batch_size=batch_size, pack=bool(cfg.pack))
  if spec.task == 'lm':
    return rows('document', (preflight.Side(
        spec.text_key, (spec.text_key,), 1, seq_len, 'seq_len'),),
                drops=False, loss_side=0, untrained=None)
  if is_instruction(spec):
    return rows('record', (preflight.Side(
        'prompt + completion', files.INSTRUCTION_KEYS, 1, seq_len,
        'seq_len'),), drops=False, loss_side=0, untrained='prompt')
  src, tgt = translation_keys(spec, cfg.direction)
  src_flag = 'data.src_len' if cfg.src_len else 'seq_len'
  return rows('pair', (
      preflight.Side(src, (src,), 1, cfg.src_len or seq_len, src_flag),
      preflight.Side(tgt, (tgt,), 1, seq_len, 'seq_len')),
              drops=True, loss_side=1, untrained=None)


def training_preflight(cfg: Any, tokenizer: Tokenizer, *,
                       sample: int = preflight.SAMPLE) -> list[Any]:
  """Before the first step: what the training split of an experiment
  config (each source of a mixture) gives in its rows, measured on up to
  ``sample`` examples of its token store (written first where missing):
  ``preflight.Report`` (or ``StreamReport``) with the pre-flight line,
  the warning and the refusal (``check``)."""
  d = DataConfig.of(cfg.data)
  batch_size, seq_len = cfg.batch_size, cfg.seq_len
  mixed = mixture.sources(d)
  weights = sum(s.weight for s in mixed)
  todo = [(s.data, s.train_split, s.label,
           max(1, round(batch_size * s.weight / weights))) for s in mixed]
  todo = todo or [(d, d.train_split, None, batch_size)]
  reports = []
  for data_cfg, split, label, rows_per_batch in todo:
    spec = spec_for(data_cfg)
    data_dir = DataConfig.of(data_cfg).data_dir
    store = token_store.open_or_build(
        data_dir or default_data_dir(), spec.home, split, tokenizer,
        spec.text_features, functools.partial(load_source, spec, split,
                                              data_dir))
    rows = training_rows(data_cfg, seq_len=seq_len,
                         batch_size=rows_per_batch)
    if rows is None:
      reports.append(preflight.StreamReport(
          split, _stream_length(store, spec, tokenizer), seq_len,
          rows_per_batch, label))
    else:
      reports.append(preflight.measure(rows, store, split, label=label,
                                       sample=sample))
  return reports


def _stored_training_batches(store, spec, cfg, layout, local_batch, *, seed,
                             shuffle, num_epochs, process_index,
                             process_count, tokenizer, guard):
  """Training batches from a token store, the same as the per-example path
  gives: Grain orders example numbers (cheap), and each chunk of them is
  read and built in one call, so Grain's per-element cost is paid per
  chunk rather than per example. No reader threads: reading ids from a
  memory map never waits, and threads would only contend for the GIL
  (2.5x slower measured); worker processes scale instead."""
  order = grain.MapDataset.range(len(store))[process_index::process_count]
  order = _order(order, seed=seed, shuffle=shuffle, num_epochs=num_epochs)
  build = _stored_example_fn(spec, cfg, tokenizer)
  fit = _training_fit(spec, layout)
  chunks = _Chunks(order, batching.CHUNK_SIZE).map(
      lambda numbers: [fit(build(store[i])) for i in numbers])
  return batching.PackAndBatchIterDataset(
      chunks.to_iter_dataset(grain.ReadOptions(num_threads=0,
                                               prefetch_buffer_size=0)),
      layout, local_batch, pack=cfg.pack, **guard)


class _Chunks(grain.MapDataset):
  """``parent.batch(size, batch_fn=list)``, each chunk read in one call of
  Grain's batched lookup where the parent has one: a shuffled, repeated
  order then costs one Python call per chunk instead of three per element
  (a third of the pipeline's time, measured)."""

  def __init__(self, parent: grain.MapDataset, size: int):
    super().__init__(parent)
    self._size = size

  def __len__(self) -> int:
    return -(-len(self._parent) // self._size)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    start = index * self._size
    numbers = range(start, min(start + self._size, len(self._parent)))
    lookup = getattr(self._parent, '_getitems', None)
    if lookup is None:  # pragma: no cover - Grain without batched lookup
      return [self._parent[i] for i in numbers]
    return list(lookup(list(numbers)))


def make_iterator(data_cfg: Any, split: str, tokenizer: Tokenizer, *,
                  worker_count: int = 0, worker_buffer_size: int = 2,
                  **batching: Any) -> Batches:
  """A resumable iterator of local batches (see :class:`Batches`) of
  ``make_dataset(data_cfg, split, tokenizer, **batching)``.

  worker_count > 0 builds batches in that many worker processes (Grain's
  multiprocessing), each reading, packing and batching its own share of
  this host's examples, worker_buffer_size batches ahead; the batches then
  come from the workers in turn. 0 builds them in this process (threads).
  """
  ds = make_dataset(data_cfg, split, tokenizer, **batching)
  if worker_count:
    if not flags.FLAGS.is_parsed():  # Grain's workers read absl flags
      flags.FLAGS.mark_as_parsed()
    # Batches come back pickled, not in shared memory: on a CPU, JAX may
    # keep using a batch's buffer after the iterator is gone, and shared
    # memory outliving its iterator is reported as leaked at exit.
    ds = grain.experimental.WithOptionsIterDataset(
        ds, grain.experimental.DatasetOptions(min_shm_size=2 ** 62))
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=worker_count, per_worker_buffer_size=worker_buffer_size),
        worker_init_fn=workers.end_with_parent)
  return Batches(iter(ds), worker_count)


class Batches:
  """Local batches, and the position in their stream.

  ``get_state()`` returns a small dict to store with the checkpoint;
  ``set_state(state)`` on a fresh iterator built with the same arguments
  continues with exactly the batch that would have come next. The worker
  count is part of the stream (each worker packs its own share of the
  examples), so a state saved with another count is refused in one
  sentence rather than continued as a different stream.
  """

  def __init__(self, iterator: grain.DatasetIterator, worker_count: int):
    self._it, self.worker_count = iterator, worker_count
    self._closed = False

  def __iter__(self) -> Batches:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._it)

  def get_state(self) -> dict[str, Any]:
    state = self._it.get_state()
    return {'worker_count': self.worker_count, 'grain': state}

  def set_state(self, state: Mapping[str, Any]) -> None:
    if 'grain' not in state:  # saved before worker counts were recorded
      state = {'worker_count': 0, 'grain': state}
    saved = state['worker_count']
    if saved != self.worker_count:
      raise UsageError(
          f'The checkpoint\'s input stream was made by {saved} data workers '
          f'and this run has {self.worker_count}; another count makes '
          'another stream, so set config.data.worker_count='
          f'{saved} to resume it exactly.')
    self._it.set_state(state['grain'])

  def close(self) -> None:
    """Stops the worker processes and reader threads now, in bounded time
    whatever state the workers are in (see ``workers.stop``)."""
    if self._closed:
      return
    self._closed = True
    if self.worker_count:
      workers.stop(self._it)
    else:
      self._it.close()


def train_iterator(cfg: Any, tokenizer: Tokenizer, **batching: Any
                   ) -> Batches:
  """The training batches of an experiment config: ``cfg.data`` on its
  ``train_split``, ``cfg.batch_size`` rows of ``cfg.seq_len``, shuffled by
  ``cfg.seed``, built by ``data.worker_count`` processes. ``batching``
  adds or overrides ``make_dataset``'s keyword arguments."""
  d = DataConfig.of(cfg.data)
  return make_iterator(
      d, d.train_split, tokenizer, worker_count=d.worker_count,
      worker_buffer_size=d.worker_buffer_size,
      **{'batch_size': cfg.batch_size, 'seq_len': cfg.seq_len,
         'seed': cfg.seed, **batching})


def initial_state(cfg: Any) -> dict[str, Any]:
  """What ``train_iterator(cfg, ...).get_state()`` gives before the first
  batch, without reading the dataset (for a checkpoint written outside
  training, e.g. of imported parameters).

  An unread iterator's state follows from the pipeline's shape, not from
  the examples, so it is taken from the same pipeline over a one-example
  stand-in source, tokenized as bytes.
  """
  data_cfg = DataConfig.of(cfg.data)
  spec = spec_for(cfg.data)
  if spec.task == 'translation':
    example = dict.fromkeys(translation_keys(spec, data_cfg.direction), 'a')
  else:  # enough tokens for one window of a stream
    example = {spec.text_key: 'a' * (cfg.seq_len + 1)}
  it = train_iterator(cfg, ByteTokenizer(), process_index=0, process_count=1,
                      source=[example])
  try:
    return it.get_state()
  finally:
    it.close()


def global_batch(local_batch: Mapping[str, np.ndarray], mesh,
                 spec=None) -> dict[str, Any]:
  """Assembles the processes' local batches into global sharded jax.Arrays.

  Each array [B_local, L] of this process becomes its rows of a global array
  [B_local * processes, L], sharded as spec over the mesh (default: the batch
  dimension over ('data', 'fsdp'), the length replicated). spec may also be a
  dict of specs per key.
  """
  if spec is None:
    spec = PartitionSpec(('data', 'fsdp'))

  def put(key, x):
    s = spec[key] if isinstance(spec, Mapping) else spec
    return jax.make_array_from_process_local_data(NamedSharding(mesh, s),
                                                  np.asarray(x))

  return {k: put(k, v) for k, v in local_batch.items()}
