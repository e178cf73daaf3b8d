"""What a compiled step's optimized HLO says: the bytes each kind of
collective moves per step, and the attention kernels it calls.

XLA's ``cost_analysis()`` counts a while loop's body once (a scanned stack
of layers is one body); here each computation's instructions are counted
as many times as its loops run (``known_trip_count``), so the figures are
per step.
"""

from __future__ import annotations

import re

import numpy as np

COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all',
               'collective-permute')

_COMPUTATION = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) ([\w\-]+)\(')
_SHAPE = re.compile(r'\b(pred|[a-z]+\d+)\[([\d,]*)\]')
_CALLED = re.compile(r'\b(body|calls)=%?([\w.\-]+)')
_CONDITION = re.compile(r'\bcondition=%?([\w.\-]+)')
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONSTANT = re.compile(r'\bs32\[\]\S* constant\((\d+)\)')
# Fused attention as each compiler calls it: cuDNN's on GPUs, a Mosaic
# (Pallas) kernel on TPUs.
_KERNELS = {'cudnn': re.compile(r'custom_call_target="__cudnn\$fmha'),
            'pallas': re.compile(r'custom_call_target="tpu_custom_call"')}


def _bytes(shape_text: str) -> int:
  """Bytes of the largest array in an HLO shape (a tuple's elements are
  the operands and results of an asynchronous collective: one moves)."""
  sizes = [0]
  for dtype, dims in _SHAPE.findall(shape_text):
    n = int(np.prod([int(d) for d in dims.split(',') if d] or [1]))
    bits = 8 if dtype == 'pred' else int(re.sub(r'\D', '', dtype) or 8)
    sizes.append(n * bits // 8)
  return max(sizes)


def _computations(hlo: str) -> tuple[dict[str, list[str]], str]:
  """Each computation's instruction lines, and the entry's name."""
  comps, name, entry = {}, None, None
  for line in hlo.splitlines():
    # Headers start at the margin; instructions are indented.
    match = _COMPUTATION.match(line)
    if match and not line[:1].isspace():
      name = match.group(1)
      comps[name] = []
      if line.startswith('ENTRY'):
        entry = name
    elif name is not None and line.strip() != '}':
      comps[name].append(line)
  return comps, entry


def _trips(line: str, comps: dict[str, list[str]]) -> int:
  """A while loop's trip count: XLA's known_trip_count where it says, else
  the bound its condition compares the counter with (``i < N``)."""
  known = _TRIPS.search(line)
  if known:
    return int(known.group(1))
  condition = _CONDITION.search(line)
  bounds = [int(n) for text in comps.get(condition.group(1), ())
            for n in _CONSTANT.findall(text)] if condition else []
  return max(bounds, default=1)


def _runs(comps: dict[str, list[str]], entry: str) -> dict[str, int]:
  """How many times each computation runs per call of the entry."""
  runs, todo = {entry: 1}, [entry]
  while todo:
    name = todo.pop()
    for line in comps.get(name, ()):
      for kind, called in _CALLED.findall(line):
        times = runs[name] * (_trips(line, comps) if kind == 'body' else 1)
        if called in comps and runs.get(called, 0) < times:
          runs[called] = times
          todo.append(called)
  return runs


def collective_bytes(hlo: str) -> dict[str, int]:
  """Bytes per step of each collective kind (the largest array each
  instruction moves, times the runs of its computation)."""
  comps, entry = _computations(hlo)
  runs = _runs(comps, entry) if entry else {}
  totals = dict.fromkeys(COLLECTIVES, 0)
  for name, lines in comps.items():
    for line in lines:
      match = _INSTRUCTION.match(line)
      if not match:
        continue
      op = match.group(2).removesuffix('-start')
      if op in totals and not match.group(2).endswith('-done'):
        totals[op] += _bytes(match.group(1)) * runs.get(name, 0)
  return totals


def attention_kernels(hlo: str) -> list[str]:
  """The fused attention kernels the HLO calls ('cudnn', 'pallas')."""
  return [name for name, pattern in _KERNELS.items() if pattern.search(hlo)]
