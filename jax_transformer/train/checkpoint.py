"""Orbax checkpoints of the train state, plus the files saved beside them.

A workdir holds:
  checkpoints/<step>/  params, train (opt_state, step, rng), data (iterator
                       state, JSON) as Orbax items; a LoRA run's params are
                       its adapters alone, the frozen base being read
                       again from config.init_from on restore
  config.json          the experiment config (paths absolute)
  data.json            what its data was (``data/corpus.py``)
  tokenizer/           the tokenizer the model was trained with
  tokenizer.sha256     its fingerprint, written once tokenizer/ is whole

Every function takes the workdir as ``runtime.workdir.WorkdirPaths`` (a
string is resolved on entry), local or in object storage.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import weakref
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils
from orbax.checkpoint._src.metadata import array_metadata_store

from jax_transformer.data import corpus
from jax_transformer.data.tokenizers import fingerprint, load_tokenizer
from jax_transformer.errors import UsageError, named_line
from jax_transformer.experiment import DataConfig, Experiment, doors
from jax_transformer.model import lora
from jax_transformer.model.params import is_scanned, to_layout
from jax_transformer.runtime import distributed, storage
from jax_transformer.runtime.workdir import WorkdirPaths, resolve


class CheckpointMismatch(UsageError):
  """A readable checkpoint whose arrays do not fit this run's config (a
  changed model), as opposed to one a torn write left unreadable."""


class SaveFailed(RuntimeError):
  """A checkpoint write failed (raised at the first check after it)."""


# Checkpointers not closed yet: each may hold a save in flight and Orbax's
# threads (tests check that none outlives its test).
_OPEN: weakref.WeakSet = weakref.WeakSet()


def open_checkpointers() -> list['Checkpointer']:
  """The Checkpointers not closed yet."""
  return list(_OPEN)


# Orbax divides the writing of a replicated array among its replicas by
# slicing it on the devices first: an eager slice per array, each shape
# compiled on first use. A replica's share under a megabyte is copied to
# the host in microseconds, so the slicing only costs: a tiny LM's save took
# 2.7 s, 0.3 s without it. Larger arrays are still divided.
MIN_REPLICA_SLICE_BYTES = 1 << 20


@functools.cache
def _divide_only_large_arrays() -> None:
  """Registers, once per process and for every Orbax save in it, a handler
  for jax.Array as Orbax's default (with the same metadata store, from
  Orbax's private module: pinned <0.13) but for the bound."""
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(
          array_metadata_store=array_metadata_store.Store(),
          min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES),
      override=True)


class Checkpointer:
  """Saves every N steps (async), keeps the last K, restores any mesh."""

  def __init__(self, workdir: str | WorkdirPaths, keep: int = 3,
               async_save: bool = True, read_base=None):
    # read_base(config, abstract base params) -> the frozen base of a LoRA
    # run (``init_from.frozen_base``): given by whoever opens one, since
    # reading a base may read another workdir's checkpoints in turn.
    self._read_base = read_base
    # Orbax reads every step's metadata here and logs a damaged one in its
    # own words; restore() reports it in ours.
    self.paths = resolve(workdir)
    with _quiet_orbax():
      _divide_only_large_arrays()  # Orbax logs the override
      self.manager = ocp.CheckpointManager(
          self.paths.checkpoints,
          options=ocp.CheckpointManagerOptions(
              max_to_keep=keep, enable_async_checkpointing=async_save,
              create=True,
              # Temporary step folders a killed save left behind.
              cleanup_tmp_directories=True,
              # A step's folder is made inside save(), so that a failure to
              # make it is raised there: made in the background, it leaves
              # Orbax's writer threads waiting 300 s for it, and the process
              # cannot exit until they give up.
              async_options=ocp.AsyncOptions(
                  create_directories_asynchronously=False)))
    _OPEN.add(self)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, state: dict[str, Any], data_state: Any) -> None:
    """Saves the state and every process's data-iterator state (all
    processes call this together)."""
    step = int(jax.device_get(state['step']))
    train = {k: v for k, v in state.items() if k != 'params'}
    try:
      self.manager.save(step, args=ocp.args.Composite(
          params=ocp.args.StandardSave(lora.trainable(state['params'])),
          train=ocp.args.StandardSave(train),
          data=ocp.args.JsonSave({'processes': _gather_json(data_state)})),
                        force=True)
    except OSError as err:  # the step's folder could not be made
      raise self._failed(err) from err

  def saved_scanned(self, step: int) -> bool:
    """Whether the checkpoint at step holds its layers scanned (stacked)."""
    return is_scanned(self._saved_params(step).keys())

  def _saved_params(self, step: int) -> dict[str, Any]:
    """The checkpoint's parameter metadata (names to shape and dtype)."""
    path = self.paths.checkpoint(step) / 'params'
    # The handler reads the tree's metadata without looking for a step-level
    # metadata file (which StandardCheckpointer warns is missing).
    return ocp.StandardCheckpointHandler().metadata(path)

  def check_fits(self, abstract_params: dict[str, Any], step: int) -> None:
    """Raises CheckpointMismatch naming the first parameter whose saved
    shape differs from abstract_params' (in the checkpoint's layout)."""
    differ = _first_difference(self._saved_params(step), abstract_params)
    if differ:
      name, have, want = differ
      raise CheckpointMismatch(
          f'Checkpoint step {step} in {self.manager.directory} holds '
          f'{name} with shape {have}, this config builds {want}: the model '
          'config changed; use the config it was trained with or a new '
          '--workdir.')

  def check_optimizer_fits(self, abstract_train: dict[str, Any], step: int
                           ) -> None:
    """Raises CheckpointMismatch naming the first optimizer-state entry
    that the checkpoint and abstract_train (the state less params) do not
    both hold with one shape."""
    path = self.paths.checkpoint(step) / 'train'
    # The handler, not StandardCheckpointer: see _saved_params.
    saved = ocp.StandardCheckpointHandler().metadata(path)
    differ = _first_difference(
        {'.'.join(k): v for k, v in ocp.tree.to_flat_dict(saved).items()},
        {'.'.join(k): v for k, v in
         ocp.tree.to_flat_dict(abstract_train).items()})
    if differ:
      name, have, want = differ
      if have is None:
        held = f'lacks {name}, which this config builds with shape {want}'
      elif want is None:
        held = f'holds {name}, which this config does not build'
      else:
        held = f'holds {name} with shape {have}, this config builds {want}'
      raise CheckpointMismatch(
          f'Checkpoint step {step} in {self.manager.directory} {held}: the '
          'optimizer state changed '
          '(optim.optimizer, clip_norm on or off, grad_accum_steps above 1 '
          'or not, or a version before per-token accumulation); resume with '
          'the config it was trained with or use a new --workdir.')

  def _other_layout(self, abstract: Any, step: int):
    """(abstract as the checkpoint lays its layers out, a function from
    what is restored to abstract's layout and shardings)."""
    scan = is_scanned(_param_names(abstract))
    saved = self.saved_scanned(step)
    if saved == scan:
      return abstract, lambda tree: tree
    shardings = jax.tree.map(lambda x: x.sharding, abstract)
    convert = jax.jit(lambda tree: to_layout(tree, scan),
                      out_shardings=shardings)
    return to_layout(abstract, saved), convert

  def restore(self, abstract_state: dict[str, Any],
              step: int | None = None) -> tuple[dict[str, Any], Any]:
    """The state (placed as abstract_state's shardings) and data state.

    A checkpoint written with the other layer layout (scan_layers) is
    converted to abstract_state's. Without ``step``, a checkpoint that
    cannot be read (a torn write, a damaged or missing file) is moved aside
    within checkpoints/ (``STEP.unreadable``), with one line naming it and
    why, and the newest one that every process can read is restored; a run
    then saves over the same step numbers. If none can be read, the newest
    one's error is raised and nothing is moved.
    """
    if step is not None:
      return self._restore_step(abstract_state, step)
    errors, restored = [], None
    with _quiet_orbax():  # its own lines about damaged files: ours follow
      for candidate in sorted(self.manager.all_steps(), reverse=True):
        try:
          attempt = self._restore_step(abstract_state, candidate)
        except CheckpointMismatch:
          raise  # readable but another model: older steps would not fit
        except Exception as err:  # pylint: disable=broad-except
          attempt, error = None, err
        if distributed.everywhere(attempt is not None):
          restored = attempt
          break
        errors.append((candidate, error if attempt is None else
                       RuntimeError('another process could not read it')))
    if restored is None:
      if errors:
        raise errors[0][1]
      raise FileNotFoundError(f'{self.manager.directory} holds no checkpoint.')
    for skipped, err in errors:
      moved = self._move_aside(skipped)
      _notice(f'Checkpoint step {skipped} could not be read '
              f'({named_line(err)}); moved it to '
              f'{moved} and resumed from step {candidate}.')
    if errors:
      self.manager.reload()  # forget the moved steps: they are saved again
    return restored

  def _move_aside(self, step: int) -> str:
    """Renames checkpoints/STEP to STEP.unreadable (STEP.unreadable.N when
    taken) on process 0, where nothing reads or deletes it; all processes
    wait for it. Returns the new path."""
    directory = self.paths.checkpoints
    target, n = directory / f'{step}.unreadable', 1
    while target.exists():
      target, n = directory / f'{step}.unreadable.{n}', n + 1
    if jax.process_index() == 0:
      self.paths.checkpoint(step).rename(target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f'moved aside step {step}')
    return str(target)

  def frozen(self, abstract_params: dict[str, Any]) -> dict[str, Any]:
    """The frozen base of a LoRA run (``{}`` otherwise), read from its
    config.init_from onto abstract_params' shardings."""
    base = lora.frozen(abstract_params)
    if not base:
      return {}
    if self._read_base is None:
      raise UsageError(f'{self.paths} holds LoRA adapters, which need their '
                       'base model: open it with train.py, '
                       'scripts/generate.py, export.py or evaluate.py.')
    return self._read_base(load_config(self.paths), base)

  def _restore_step(self, abstract_state: dict[str, Any], step: int
                    ) -> tuple[dict[str, Any], Any]:
    full = abstract_state['params']
    abstract_state = dict(abstract_state, params=lora.trainable(full))
    state, data_state = self._restore_trained(abstract_state, step)
    frozen = self.frozen(full)
    if frozen:
      state = dict(state, params={**frozen, **state['params']})
    return state, data_state

  def _restore_trained(self, abstract_state: dict[str, Any], step: int
                       ) -> tuple[dict[str, Any], Any]:
    abstract_state, convert = self._other_layout(abstract_state, step)
    self.check_fits(abstract_state['params'], step)
    train = {k: v for k, v in abstract_state.items() if k != 'params'}
    self.check_optimizer_fits(train, step)
    try:
      got = self.manager.restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(abstract_state['params']),
          train=ocp.args.StandardRestore(train),
          data=ocp.args.JsonRestore()))
    except (ValueError, KeyError, TypeError) as err:
      raise ValueError(
          f'Checkpoint at step {step} in {self.manager.directory} does not '
          f'match this model/optimizer config: {err}') from err
    state = convert(dict(got['train'], params=got['params']))
    return state, _own_data_state(got['data']['processes'])

  def restore_params(self, abstract_params: dict[str, Any],
                     step: int | None = None) -> dict[str, Any]:
    """Only the parameters (for inference), placed as abstract_params."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f'{self.manager.directory} holds no checkpoint '
                              'yet.')
    full = abstract_params
    abstract_params, convert = self._other_layout(lora.trainable(full), step)
    self.check_fits(abstract_params, step)
    params = convert(self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params)))['params'])
    return {**self.frozen(full), **params}

  def check_errors(self) -> None:
    """Raises SaveFailed if a background save has failed (cheap: call it
    every step, so a failed write stops the run at once rather than at the
    next save)."""
    if not self.manager.is_saving_in_progress():
      self.wait()  # returns at once; raises what the finished save raised

  def wait(self) -> None:
    """Waits for a save in flight; raises SaveFailed if it failed."""
    try:
      self.manager.wait_until_finished()
    except Exception as err:  # pylint: disable=broad-except
      raise self._failed(err) from err

  def _failed(self, err: BaseException) -> SaveFailed:
    return SaveFailed(
        f'Writing a checkpoint to {self.manager.directory} failed '
        f'({named_line(err)}); check the disk (space, '
        'permissions), then rerun to resume from the newest complete '
        'checkpoint.')

  def close(self) -> None:
    """Waits for a save in flight and stops Orbax's threads; a save that
    failed was reported by wait() or check_errors(), not again here. A
    second call does nothing."""
    if self not in _OPEN:
      return
    _OPEN.discard(self)
    try:
      # Orbax's close does not wait for the clean-up of temporary folders
      # that the manager starts when made: a run stopped a moment after
      # (a signal while it starts) left it failing at interpreter exit
      # with a traceback.
      cleanup = getattr(self.manager, '_maybe_await_cleanup_tmp_directory',
                        None)
      if cleanup is not None:
        cleanup()
      self.manager.close()
    except Exception:  # pylint: disable=broad-except
      logging.info('Closing the checkpoint manager after a failed save.')


def _first_difference(saved: dict[str, Any], wanted: dict[str, Any]):
  """(name, saved shape, wanted shape) for the first name, in sorted order,
  whose shapes differ or that only one side holds (None on the other), or
  None: both map names to arrays or array metadata."""
  for name in sorted(set(saved) | set(wanted)):
    have = tuple(saved[name].shape) if name in saved else None
    want = tuple(wanted[name].shape) if name in wanted else None
    if have != want:
      return name, have, want
  return None


def _param_names(tree: Any) -> list[str]:
  """The parameter names in a state or params dict."""
  return list(tree['params'] if 'params' in tree else tree)


def _gather_json(value: Any) -> list[Any]:
  """Every process's JSON-able value, in process order (a collective).

  Only process 0 writes JSON items, and each host's iterator is at its own
  position (packing makes them differ), so all positions are saved.
  """
  if jax.process_count() == 1:
    return [value]
  blob = np.frombuffer(json.dumps(value).encode(), np.uint8)
  lengths = multihost_utils.process_allgather(np.int32(blob.size))
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:blob.size] = blob
  blobs = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(b[:n])) for b, n in zip(blobs, lengths)]


def _notice(message: str, every_process: bool = False) -> None:
  """One line for the user on stderr, from process 0 only unless
  every_process (a line about this process), without a logger's prefix."""
  if every_process or jax.process_index() == 0:
    print(message, file=sys.stderr, flush=True)


def _own_data_state(states: list[Any]) -> Any:
  """This process's saved iterator state."""
  if len(states) != jax.process_count():
    # Another number of hosts reads other shards: positions do not map.
    _notice(f'Checkpoint has data positions for {len(states)} processes, '
            f'this run has {jax.process_count()}: process '
            f'{jax.process_index()} continues from saved process '
            f'{jax.process_index() % len(states)}\'s.', every_process=True)
  return states[jax.process_index() % len(states)]


def save_side_files(workdir: str | WorkdirPaths, config: dict[str, Any],
                    data_config: DataConfig, tokenizer) -> None:
  """config.json (``config``: ``Experiment.saved_form()``, its paths
  absolute) and data.json (what data_config reads: ``data.corpus``), and
  once tokenizer/ with its fingerprint, beside the checkpoints (process 0
  only; ``tokenizer`` from ``run_tokenizer``)."""
  paths = resolve(workdir)
  paths.root.mkdir(parents=True, exist_ok=True)
  storage.write_atomic(paths.config,
                       json.dumps(config, indent=2, sort_keys=True))
  try:
    record = corpus.record(data_config)
  except (UsageError, OSError):  # an import's config naming no files here
    record = None
  if record is not None:
    storage.write_atomic(corpus.path_in(paths.root),
                         json.dumps(record, indent=2, sort_keys=True))
  if paths.fingerprint.exists() and paths.tokenizer.exists():
    return  # a resumed model keeps its vocabulary
  tokenizer_dir = paths.tokenizer
  if tokenizer_dir.exists():
    tokenizer_dir.rmtree()  # an attempt killed mid-write, or an old layout
  tokenizer.save(tokenizer_dir)
  # Written last: the fingerprint says tokenizer/ is whole (object stores
  # have no atomic folder rename).
  storage.write_atomic(paths.fingerprint, fingerprint(tokenizer) + '\n')


def run_tokenizer(workdir: str | WorkdirPaths, prepared, has_checkpoint: bool):
  """The tokenizer a run trains with: the workdir's, checked against its
  fingerprint, or for a new run the prepared data's.

  Raises UsageError where the checkpoints' tokenizer is lost or changed:
  tokenizer/ edited after its fingerprint was written, or missing while
  checkpoints exist and the data's tokenizer is not the one recorded.
  """
  paths = resolve(workdir)
  saved_dir, marker = paths.tokenizer, paths.fingerprint
  recorded = marker.read_text().strip() if marker.exists() else None
  saved = _try_load_tokenizer(saved_dir)
  if saved is not None and recorded in (None, fingerprint(saved)):
    if fingerprint(saved) != fingerprint(prepared):
      _notice(f'Training with {saved_dir} (the checkpoints\' tokenizer); the '
              'data directory\'s tokenizer differs.')
    return saved
  if saved is not None:
    raise UsageError(f'{saved_dir} no longer matches its fingerprint in '
                     f'{marker}: it was changed after training started; put '
                     'the original back or use a new --workdir.')
  if not has_checkpoint or recorded == fingerprint(prepared):
    return prepared
  data = ('differs from the recorded one' if recorded
          else 'cannot be checked against it (no fingerprint)')
  raise UsageError(
      f'{workdir} holds checkpoints but not the tokenizer they were trained '
      f'with ({saved_dir} is missing or unreadable), and the data '
      f'directory\'s tokenizer {data}; restore tokenizer/ or use a new '
      '--workdir.')


def _try_load_tokenizer(directory):
  """The tokenizer saved in directory, or None where there is none whole."""
  if not directory.exists():
    return None
  try:
    return load_tokenizer(directory)
  except (OSError, ValueError, KeyError, RuntimeError):
    return None


def load_config(workdir: str | WorkdirPaths
                ) -> Experiment | None:
  """The workdir's config.json, or None where it has none."""
  path = resolve(workdir).config
  if not path.exists():
    return None
  return doors.from_saved(json.loads(path.read_text()))


@contextlib.contextmanager
def _quiet_orbax():
  """absl's log (Orbax writes to it) silenced: a damaged checkpoint is
  reported once, by this module, in one line."""
  before = logging.get_verbosity()
  logging.set_verbosity(logging.FATAL)
  try:
    yield
  finally:
    logging.set_verbosity(before)


class Saving:
  """Checkpoints as a training hook (see hooks.py): every
  ``checkpoint_every`` steps, at the last step and when the run stops; a
  background save that failed stops the run at the next step; the end
  waits for the last save (raising SaveFailed for one that failed) and
  closes the checkpointer, so that none of its threads outlives the loop.
  """
  part = 'checkpoint'

  def __init__(self, checkpointer: Checkpointer, every: int):
    self._checkpointer = checkpointer
    self._every = every

  def dispatched(self, run, metrics) -> None:
    del run, metrics
    self._checkpointer.check_errors()

  def after_step(self, run) -> None:
    if not (run.step % self._every == 0 or run.last or run.stop):
      return
    run.finish_steps()
    run.hooks.before_save(run)  # never save a state a bad step made
    self._checkpointer.save(run.state, run.train_iter.get_state())
    run.hooks.saved(run)

  def end(self, run) -> None:
    del run
    try:
      self._checkpointer.wait()
    finally:
      self._checkpointer.close()
