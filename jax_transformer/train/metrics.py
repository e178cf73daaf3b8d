"""Training metrics: the rows a run logs (losses, rates, and what other
hooks add), written to a JSONL file and TensorBoard events in the workdir.
"""

from __future__ import annotations

import functools
import io
import json
import os
import sys
from typing import Mapping

import jax
from etils import epath

from jax_transformer.experiment import StepShape
from jax_transformer.runtime import storage
from jax_transformer.runtime.workdir import WorkdirPaths, resolve
from jax_transformer.train import optim, perf

# What tensorboardX imports, where installed, for what this package never
# asks of it: torch (about 2 s) to accept torch tensors; boto3 and Google's
# storage client (0.45 s together) for its own s3:// and gs:// event
# writers. A workdir in s3:// is refused (runtime/storage.py), and for gs://
# _tensorboard registers a writer of this package in place of its own.
_HIDDEN_FROM_TENSORBOARDX = ('torch', 'boto3', 'google.cloud.storage')


@functools.cache
def _import_tensorboardx():
  """Imports tensorboardX on the first writer (process 0 of a run; a
  decoding or evaluating process never needs it) without the modules of
  _HIDDEN_FROM_TENSORBOARDX that are not imported yet: a None in
  sys.modules makes their import fail as if they were absent, and is taken
  out again so that a later import of them works. For that moment, another
  thread's first import of one of them would fail too; a gs:// run has
  imported Google's storage client long before (Orbax lists its steps)."""
  hidden = [name for name in _HIDDEN_FROM_TENSORBOARDX
            if name not in sys.modules]
  try:
    for name in hidden:
      sys.modules[name] = None
    import tensorboardX  # pylint: disable=g-import-not-at-top
  finally:
    for name in hidden:
      sys.modules.pop(name, None)
  return tensorboardX


class MetricWriter:
  """Writes scalars per step; a no-op writer on processes other than 0.

  A local metrics.jsonl is appended to; one in object storage, which has no
  append, is put again whole at every write (it stays small: a row per
  log_every steps). Nothing is created before the first row, so a run
  refused before its first step leaves the workdir as it was.
  """

  def __init__(self, workdir: str | WorkdirPaths, enabled: bool = True):
    self.enabled = enabled
    self._workdir = workdir
    self._opened = False

  def _open(self) -> None:
    self._opened = True
    paths = resolve(self._workdir)
    root = paths.root
    root.mkdir(parents=True, exist_ok=True)
    self._path = paths.metrics
    self._text, self._jsonl = None, None
    if storage.is_remote(root):
      self._text = self._path.read_text() if self._path.exists() else ''
      self._text = self._text[:self._text.rfind('\n') + 1]  # see below
    else:
      _cut_torn_line(self._path)
      self._jsonl = open(self._path, 'a')
    self._tb = _tensorboard(paths)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    if not self._opened:
      self._open()
    row = {'step': int(step), **{k: float(v) for k, v in scalars.items()}}
    line = json.dumps(row) + '\n'
    if self._jsonl is not None:
      self._jsonl.write(line)
      self._jsonl.flush()
    else:
      self._text += line
      storage.write_atomic(self._path, self._text)
    if self._tb is not None:
      for name, value in row.items():
        if name != 'step':
          self._tb.add_scalar(name, value, step)
      self._tb.flush()

  def close(self) -> None:
    if self.enabled and self._opened:
      if self._jsonl is not None:
        self._jsonl.close()
      if self._tb is not None:
        self._tb.close()


def _tensorboard(paths: WorkdirPaths):
  """A TensorBoard writer under WORKDIR/tensorboard."""
  tensorboardx = _import_tensorboardx()
  for kind in storage.REMOTE_SCHEMES:
    tensorboardx.record_writer.register_writer_factory(kind, _StoredEvents())
  return tensorboardx.SummaryWriter(str(paths.tensorboard))


class _StoredEvents:
  """tensorboardX's writers of event files in object storage: through epath,
  as every other file of the workdir.

  In place of tensorboardX's own gs:// writer, which puts its file again
  whenever it is collected; tensorboardX keeps each SummaryWriter until the
  process exits (an atexit hook), so every run's events went up once more
  at exit, and where storage could not be reached by then, the exit waited
  out a 120 s retry per run.
  """

  def open(self, path: str):
    return _StoredEventFile(path)

  def directory_check(self, path: str) -> None:
    del path  # object storage has no folders to make


class _StoredEventFile:
  """An event file put whole at each flush that added to it (an object
  store has no append; the file stays small: a few scalars per row)."""

  def __init__(self, path: str):
    self._path = epath.Path(path)
    self._data = io.BytesIO()
    self._stored = None

  def write(self, data: bytes) -> None:
    self._data.write(data)

  def flush(self) -> None:
    if self._stored != self._data.tell():
      storage.write_atomic(self._path, self._data.getvalue())
      self._stored = self._data.tell()

  def close(self) -> None:
    self.flush()


def _cut_torn_line(path) -> None:
  """Drops a last line that has no newline: half a row, left by a run
  killed while writing it, which the next row appended would corrupt."""
  if not os.path.exists(path):
    return
  with open(path, 'rb+') as f:
    text = f.read()
    if text and not text.endswith(b'\n'):
      f.truncate(text.rfind(b'\n') + 1)


def read_jsonl(workdir: str | WorkdirPaths) -> list[dict]:
  text = resolve(workdir).metrics.read_text()
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_history(workdir: str | WorkdirPaths) -> list[dict]:
  """The rows of metrics.jsonl as one run, steps strictly increasing.

  A resumed run logs again the steps after its last checkpoint: a row whose
  step is not past the previous one replaces the rows from that step on. A
  last line cut short (a run killed while writing) is ignored.
  """
  text = resolve(workdir).metrics.read_text()
  lines = [line for line in text.splitlines() if line.strip()]
  history: list[dict] = []
  for i, line in enumerate(lines):
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      if i == len(lines) - 1:
        break
      raise
    while history and history[-1]['step'] >= row['step']:
      history.pop()
    history.append(row)
  return history


class Rows:
  """Metrics rows as a training hook (see hooks.py): every ``log_every``
  steps and at the last, the losses of the steps since the previous row
  (per target token), the last gradient norm, learning rate and skip
  counters, the rates (``Throughput``), and what the other hooks' ``row``
  moments add (evaluation, time parts); then ``logged``.
  """

  def __init__(self, setup, rates: Throughput, log_every: int,
               grad_accum_steps: int):
    self._setup = setup
    self._rates = rates
    self._log_every = log_every
    self._grad_accum_steps = grad_accum_steps
    self._sums = []  # host metrics of the steps since the last row

  def finished(self, run, step: int, metrics: dict) -> None:
    del run, step
    self._sums.append(metrics)

  def after_step(self, run) -> None:
    if not (run.step % self._log_every == 0 or run.last):
      return
    run.finish_steps()
    sums, self._sums = self._sums, []
    row = summarise(sums, self._setup.schedule, self._grad_accum_steps,
                    run.step)
    # Training time since the last row: evaluation, compiles and rows
    # themselves are not.
    seconds = run.clock.since_row('data_wait', 'step', 'checkpoint')
    row.update(self._rates.row(len(sums), row['target_tokens'], seconds))
    if run.compile_s is not None:  # once, in the first row
      row['compile_s'], run.compile_s = run.compile_s, None
    run.hooks.row(run, row)
    run.writer.write(run.step, row)
    run.row = row
    run.hooks.logged(run, row)


class Throughput:
  """Rates over completed steps: step time, tokens/s and, where the
  device's peak is known (config.peak_tflops, or built in for H100, H200,
  A100 and TPUs), model FLOPs utilisation (see ``perf.py``)."""

  def __init__(self, shape: StepShape, model_config,
               peak_tflops: float | None = None):
    """A step of ``shape``; ``peak_tflops`` (config.peak_tflops) per device,
    else the device kind's built-in peak."""
    self.step_flops = perf.step_flops(model_config, shape.batch_size,
                                      shape.source_len,
                                      shape.seq_len)['train']
    peak = (peak_tflops * 1e12 if peak_tflops else
            perf.peak_flops(jax.devices()[0].device_kind))
    self.peak = None if peak is None else peak * jax.device_count()

  def row(self, steps_done: int, tokens: float, seconds: float
          ) -> dict[str, float]:
    """Rates of ``steps_done`` steps that took ``seconds`` end to end."""
    seconds = max(seconds, 1e-9)
    out = {'step_time_s': seconds / steps_done,
           'tokens_per_s': tokens / seconds,
           'model_tflops_per_s': self.step_flops * steps_done / seconds / 1e12}
    if self.peak:
      out['mfu'] = self.step_flops * steps_done / seconds / self.peak
    return out


def summarise(sums: list[dict], schedule, grad_accum_steps: int,
              step: int) -> dict[str, float]:
  """Losses per target token, the last gradient norm and learning rate
  (``schedule`` of the updates so far) of the steps whose host metrics are
  ``sums``, the last being ``step``."""
  tokens = sum(float(m['tokens']) for m in sums)
  updates = (step - 1) // grad_accum_steps
  return {
      'loss': sum(float(m['loss']) for m in sums) / max(tokens, 1.0),
      'nll': sum(float(m['nll']) for m in sums) / max(tokens, 1.0),
      'grad_norm': float(sums[-1]['grad_norm']),
      'learning_rate': float(schedule(updates)),
      # Target tokens since the last row; summed over rows, the tokens seen.
      'target_tokens': tokens,
      # Skipped updates (optim.skip_non_finite) as of the row's last step.
      **{k: float(sums[-1][k]) for k in optim.SKIP_COUNTERS
         if k in sums[-1]},
  }
