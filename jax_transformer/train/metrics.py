"""Training metrics: a JSONL file and TensorBoard events in the workdir."""

from __future__ import annotations

import json
import os
from typing import Mapping

from absl import logging
from tensorboardX import SummaryWriter, record_writer

from jax_transformer.runtime import storage
from jax_transformer.runtime.workdir import WorkdirPaths, resolve


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
  """A TensorBoard writer under WORKDIR/tensorboard, or None (with a
  warning) where tensorboardX cannot reach the workdir's object store."""
  root = paths.root
  kind = storage.scheme(root)
  if kind is not None and not {'gs': record_writer.GCS_ENABLED,
                               's3': record_writer.S3_ENABLED}.get(kind):
    logging.warning('No TensorBoard events in %s: tensorboardX needs '
                    'google-cloud-storage (gs://) or boto3 (s3://); '
                    'metrics.jsonl is written.', root)
    return None
  return SummaryWriter(str(paths.tensorboard))


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
