"""One prepared split of a dataset (a ``DatasetSpec``) as Grain batches.

Every kind of source (``sources``) ends as a TFDS dataset and its token
stores, so one function batches them all: ``batches`` reads a split's token
store (or, in tests, a source of text), and gives a stream language model
its windows, every other task its examples padded or packed into rows.
What the rows keep of an example (``training_rows``) is the data
pre-flight's measure (``preflight``). The door from a run's config is
``pipeline.make_dataset``; this module never reads a config's kind.
"""

from __future__ import annotations

import functools
from typing import Any

import grain
import numpy as np

from jax_transformer.data import batching, files, preflight
from jax_transformer.data.datasets import DatasetSpec, as_text
from jax_transformer.data.tokenizers import Tokenizer
from jax_transformer.errors import UsageError
from jax_transformer.experiment.data import DataConfig


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


def local_batch_size(batch_size: int, process_count: int) -> int:
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


def stream_length(store, spec: DatasetSpec, tokenizer: Tokenizer) -> int:
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




def batches(spec: DatasetSpec, cfg: DataConfig, split: str,
            tokenizer: Tokenizer, *, store, source, batch_size: int,
            seq_len: int, seed: int, shuffle: bool, num_epochs: int | None,
            process_index: int, process_count: int, num_threads: int,
            cache_limit: int) -> grain.IterDataset:
  """The batches of one split (``pipeline.make_dataset`` says what each
  argument means): read from its token store ``store``, or, where that is
  None, from ``source``, a data source of text (tests)."""
  local_batch = local_batch_size(batch_size, process_count)
  evaluation = not shuffle and num_epochs == 1
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
      _iterator_refusal, training_rows(spec, cfg, seq_len=seq_len,
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


def training_rows(spec: DatasetSpec, cfg: DataConfig, *, seq_len: int,
                  batch_size: int) -> preflight.Rows | None:
  """What a training example of spec (read as cfg says) becomes in rows
  of seq_len (``preflight.Rows``); None for a stream language model
  (windows)."""
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


