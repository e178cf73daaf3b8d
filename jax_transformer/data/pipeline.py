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
  in the proportions of their weights (``sources.Mixture``).
* One door: ``make_dataset`` asks the config's source (``sources``) for
  its batches; every kind but the mixture batches one prepared split the
  same way (``splits``).
* Fast where it matters: decoding a TFDS record costs ~0.2 ms of Python, so
  splits of up to ``cache_limit`` examples (ding_en_de, the WMT dev/test sets,
  Shakespeare's stream) are read and tokenized once into memory; bigger ones
  (WMT train, lm1b) are read lazily by ``num_threads`` threads, in chunks of
  examples so that Grain's per-element cost is paid once per chunk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grain
import jax
import numpy as np
from absl import flags
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.data import preflight, sources, splits, workers
from jax_transformer.data.datasets import given_tokenizer
from jax_transformer.data.splits import translation_keys
from jax_transformer.data.tokenizers import ByteTokenizer, Tokenizer
from jax_transformer.errors import UsageError
from jax_transformer.experiment.data import DataConfig
from jax_transformer.experiment.parts import TrainBatches

DIRECTIONS = ('en-de', 'de-en')


def check_config(data_cfg: Any) -> None:
  """Refuses in one sentence, before anything is prepared, a data config
  that names nothing it could read: its own fields, the dataset (a
  'files' glob that matches nothing, a task misspelt), its mixture
  (weights, labels, one task) and its tokenizer_path."""
  d = DataConfig.of(data_cfg)
  d.check()
  sources.source_for(d).check()
  given_tokenizer(d)


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
  origin = sources.source_for(data_cfg)  # the config's kind of source
  if process_index is None or process_count is None:
    process_index, process_count = jax.process_index(), jax.process_count()
  splits.local_batch_size(batch_size, process_count)  # before any reading
  return origin.dataset(
      split, tokenizer, batch_size=batch_size, seq_len=seq_len, seed=seed,
      shuffle=shuffle, num_epochs=num_epochs, process_index=process_index,
      process_count=process_count, num_threads=num_threads,
      cache_limit=cache_limit, source=source)


def training_rows(data_cfg: Any, *, seq_len: int, batch_size: int
                  ) -> preflight.Rows | None:
  """What a training example of data_cfg becomes in rows of seq_len
  (``preflight.Rows``); None for a stream language model (windows)."""
  source = sources.source_for(data_cfg)
  return splits.training_rows(source.spec, source.config, seq_len=seq_len,
                              batch_size=batch_size)


def training_preflight(batches: TrainBatches, tokenizer: Tokenizer, *,
                       sample: int = preflight.SAMPLE) -> list[Any]:
  """Before the first step: what the training split of a run's batches
  (each source of a mixture) gives in its rows, measured on up to
  ``sample`` examples of its token store (written first where missing):
  ``preflight.Report`` (or ``StreamReport``) with the pre-flight line,
  the warning and the refusal (``check``)."""
  d = DataConfig.of(batches.data)
  batch_size, seq_len = batches.batch_size, batches.seq_len
  parts = sources.source_for(d).parts
  weights = sum(p.weight for p in parts)
  todo = [(p.data, p.train_split, p.label,
           max(1, round(batch_size * p.weight / weights))) for p in parts]
  todo = todo or [(d, d.train_split, None, batch_size)]
  reports = []
  for data_cfg, split, label, rows_per_batch in todo:
    source = sources.source_for(data_cfg)
    store = source.store(split, tokenizer)
    rows = splits.training_rows(source.spec, source.config, seq_len=seq_len,
                                batch_size=rows_per_batch)
    if rows is None:
      reports.append(preflight.StreamReport(
          split, splits.stream_length(store, source.spec, tokenizer),
          seq_len, rows_per_batch, label))
    else:
      reports.append(preflight.measure(rows, store, split, label=label,
                                       sample=sample))
  return reports


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
    # A position saved on another corpus (data.accept_changed_corpus,
    # train_iterator) is not applied: the stream starts afresh.
    self.restart = False

  def __iter__(self) -> Batches:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._it)

  def get_state(self) -> dict[str, Any]:
    state = self._it.get_state()
    return {'worker_count': self.worker_count, 'grain': state}

  def set_state(self, state: Mapping[str, Any]) -> None:
    if self.restart:
      return
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


def train_iterator(batches: TrainBatches, tokenizer: Tokenizer,
                   **batching: Any) -> Batches:
  """A run's training batches (``Experiment.train_batches``): its data on
  its ``train_split``, ``batch_size`` rows of ``seq_len``, shuffled by
  ``seed``, built by ``data.worker_count`` processes. ``batching``
  adds or overrides ``make_dataset``'s keyword arguments. With
  ``data.accept_changed_corpus`` (left on by the trainer only where the
  corpus did change since the checkpoint), ``set_state`` keeps the fresh
  stream."""
  d = DataConfig.of(batches.data)
  it = make_iterator(
      d, d.train_split, tokenizer, worker_count=d.worker_count,
      worker_buffer_size=d.worker_buffer_size,
      **{'batch_size': batches.batch_size, 'seq_len': batches.seq_len,
         'seed': batches.seed, **batching})
  it.restart = bool(d.accept_changed_corpus)
  return it


def initial_state(batches: TrainBatches) -> dict[str, Any]:
  """What ``train_iterator(batches, ...).get_state()`` gives before the first
  batch, without reading the dataset (for a checkpoint written outside
  training, e.g. of imported parameters).

  An unread iterator's state follows from the pipeline's shape, not from
  the examples, so it is taken from the same pipeline over a one-example
  stand-in source, tokenized as bytes.
  """
  data_cfg = DataConfig.of(batches.data)
  spec = sources.spec_for(data_cfg)
  if spec.task == 'translation':
    example = dict.fromkeys(translation_keys(spec, data_cfg.direction), 'a')
  else:  # enough tokens for one window of a stream
    example = {spec.text_key: 'a' * (batches.seq_len + 1)}
  it = train_iterator(batches, ByteTokenizer(), process_index=0, process_count=1,
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
