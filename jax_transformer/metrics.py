"""Training metrics: a JSONL file and TensorBoard events in the workdir."""

from __future__ import annotations

import json
import os
from typing import Mapping


class MetricWriter:
  """Writes scalars per step; a no-op writer on processes other than 0."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, 'metrics.jsonl')
    _cut_torn_line(path)
    self._jsonl = open(path, 'a')
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    row = {'step': int(step), **{k: float(v) for k, v in scalars.items()}}
    self._jsonl.write(json.dumps(row) + '\n')
    self._jsonl.flush()
    for name, value in row.items():
      if name != 'step':
        self._tb.add_scalar(name, value, step)
    self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def _cut_torn_line(path: str) -> None:
  """Drops a last line that has no newline: half a row, left by a run
  killed while writing it, which the next row appended would corrupt."""
  if not os.path.exists(path):
    return
  with open(path, 'rb+') as f:
    text = f.read()
    if text and not text.endswith(b'\n'):
      f.truncate(text.rfind(b'\n') + 1)


def read_jsonl(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f if line.strip()]


def read_history(workdir: str) -> list[dict]:
  """The rows of metrics.jsonl as one run, steps strictly increasing.

  A resumed run logs again the steps after its last checkpoint: a row whose
  step is not past the previous one replaces the rows from that step on. A
  last line cut short (a run killed while writing) is ignored.
  """
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    lines = [line for line in f if line.strip()]
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
