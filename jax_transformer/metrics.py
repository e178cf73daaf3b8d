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
    self._jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a')
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


def read_jsonl(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f if line.strip()]
