"""The benchmark record: one JSON line per benchmark run, kept in the
repository (``docs/records/measured.jsonl``), from which the docs' tables
of measured figures are made (``scripts/report.py``).

A record says what ran (suite, the command's arguments, rounds), where
(the commit and whether the tree had changes, the machine: CPU model,
cores this process may use, the instruction-set extensions that decide a
CPU's matmul speed, the accelerator), under what load (the 1-minute load
average before and after) and what came out: every figure of the rows as
its median and range over the rows that share a label (rounds of one
contender), or the row's own median and range where it carries them
(``ratio`` with ``ratio_min`` and ``ratio_max``). The rows themselves are
kept too.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
from typing import Any, Iterable

import jax

ROOT = pathlib.Path(__file__).resolve().parents[2]
MEASURED = ROOT / 'docs' / 'records' / 'measured.jsonl'
# The step model's predictions from target compiles (compile_at_size.py
# --record): kept apart, never mixed with what was measured.
PREDICTED = ROOT / 'docs' / 'records' / 'predicted.jsonl'

# The fields that name what a row measured (its label); every other
# number in it is a figure.
LABEL_FIELDS = ('suite', 'model', 'step', 'shape', 'config', 'start',
                'layout', 'side', 'option', 'batch', 'clients', 'device',
                'size', 'item', 'chip', 'configuration')
# Fields that are neither figures nor labels.
IGNORED = ('round', 'rounds', 'load_before', 'load_after', 'load_average',
           'load_average_before', 'load_average_after')
# The CPU flags that decide float32/bf16 matmul speed.
ISA = ('avx2', 'fma', 'avx512f', 'avx512_bf16', 'avx512_vnni', 'amx_tile',
       'amx_bf16', 'amx_int8')


def machine() -> dict[str, Any]:
  """The CPU model, the cores this process may use, the matmul-relevant
  instruction-set extensions, and the accelerator (None: CPU only)."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        if key.strip() == 'model name':
          model = value.strip()
        elif key.strip() == 'flags':
          flags = set(value.split())
  except OSError:
    pass
  return {'cpu': model, 'cores': len(os.sched_getaffinity(0)),
          'isa': [f for f in ISA if f in flags],
          'accelerator': _accelerator()}


def _accelerator() -> str | None:
  device = jax.devices()[0]
  if device.platform == 'cpu':
    return None
  return f'{jax.device_count()} x {device.device_kind}'


def commit(root: pathlib.Path = ROOT) -> dict[str, Any]:
  """The commit of the repository at ``root`` and whether its tree
  differed from it (a record of a changed tree measures no commit
  exactly). The records themselves are not the tree measured: suites run
  one after another append to them before anyone commits."""
  def git(*args):
    return subprocess.run(['git', *args], cwd=root, capture_output=True,
                          text=True, check=False).stdout.strip()
  sha = git('rev-parse', 'HEAD')
  changed = bool(git('status', '--porcelain', '--untracked-files=no', '--',
                      '.', f':!{MEASURED.parent.relative_to(ROOT)}'))
  return {'commit': sha or None, 'changed_tree': changed}


def label(row: dict[str, Any]) -> str:
  """What a row measured: its label fields' values joined by '/'."""
  return '/'.join(str(row[k]) for k in LABEL_FIELDS if row.get(k) is not None)


def figures(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
  """``{'<label>/<field>': {'median', 'min', 'max', 'n'}}`` for every
  numeric field of the rows: over the rows of one label, or, where a row
  carries ``<field>_min`` and ``<field>_max``, those with the row's own
  value as the median and its ``rounds`` as n."""
  values: dict[str, list[float]] = {}
  own: dict[str, dict[str, float]] = {}
  for row in rows:
    name = label(row)
    for key, value in row.items():
      if (key in LABEL_FIELDS or key in IGNORED or isinstance(value, bool)
          or not isinstance(value, (int, float))
          or key.endswith(('_min', '_max'))):
        continue
      if f'{key}_min' in row and f'{key}_max' in row:
        own[f'{name}/{key}'] = {'median': value, 'min': row[f'{key}_min'],
                                'max': row[f'{key}_max'],
                                'n': row.get('rounds', 1)}
      else:
        values.setdefault(f'{name}/{key}', []).append(float(value))
  out = {k: {'median': statistics.median(v), 'min': min(v), 'max': max(v),
             'n': len(v)} for k, v in values.items()}
  out.update(own)
  return out


def make(suite: str, rows: list[dict[str, Any]], argv: list[str],
         rounds: int | None, load_before: float | None,
         load_after: float | None) -> dict[str, Any]:
  """One record of a finished run."""
  return {'suite': suite,
          'date': datetime.datetime.now(datetime.timezone.utc).strftime(
              '%Y-%m-%d'),
          **commit(), 'machine': machine(), 'argv': list(argv),
          'rounds': rounds, 'load_before': load_before,
          'load_after': load_after, 'figures': figures(rows), 'rows': rows}


def predicted(row: dict[str, Any], argv: list[str]) -> dict[str, Any]:
  """One record of a target compile's row (compile/report.py): its
  predicted figures, the commit, date and host that compiled it."""
  return {'suite': 'predicted',
          'date': datetime.datetime.now(datetime.timezone.utc).strftime(
              '%Y-%m-%d'),
          **commit(), 'machine': machine(), 'argv': list(argv),
          'rows': [row]}


def append(record: dict[str, Any], path: str | os.PathLike = MEASURED
           ) -> None:
  """Adds the record as one line to the record file."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with path.open('a') as f:
    f.write(json.dumps(record, sort_keys=True) + '\n')


def read(path: str | os.PathLike = MEASURED) -> list[dict[str, Any]]:
  """Every record of the file, oldest first ([] where there is none)."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines()
          if line.strip()]
