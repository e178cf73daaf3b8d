"""What a compiled step's optimized HLO says: the bytes each kind of
collective moves per step, its matmul FLOPs, and the attention kernels it
calls.

XLA's ``cost_analysis()`` counts a while loop's body once (a scanned stack
of layers is one body); here each computation's instructions are counted
as many times as its loops run (``known_trip_count``), so the figures are
per step.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np

COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all',
               'collective-permute')

_COMPUTATION = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) ([\w\-]+)\(')
# An array in an HLO shape: dtype, dimensions, layout.
_ARRAY = re.compile(r'\b(pred|[a-z]+\d+)\[([\d,]*)\](?:\{([^}]*)\})?')
_ON_CHIP = 'S(1)'
_CALLED = re.compile(r'\b(body|calls)=%?([\w.\-]+)')
_CONDITION = re.compile(r'\bcondition=%?([\w.\-]+)')
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONSTANT = re.compile(r'\bs32\[\]\S* constant\((\d+)\)')
_NAME = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = ')
_DOT = re.compile(r' dot\(%?([\w.\-]+), ')
# A TPU's compiler writes matmuls as convolutions: dim_labels=LHS_RHS->OUT.
_CONVOLUTION_OPERANDS = re.compile(
    r' convolution\(%?([\w.\-]+), %?([\w.\-]+)\)')
# A GPU's compiler calls cuBLAS for a matmul: a custom call whose backend
# config holds the dot's dimensions.
_GEMM = re.compile(r'custom_call_target="__cublas\$(?:lt\$matmul|gemm)')
_CALL_LHS = re.compile(r' custom-call\(%?([\w.\-]+)')
_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_DIM_LABELS = re.compile(r'dim_labels=(\w+)_(\w+)->(\w+)')
_WINDOW = re.compile(r'window=\{([^}]*)\}')
_LHS_CONTRACTING = re.compile(r'lhs_contracting_dims=\{([\d,]*)\}')
_OPERANDS = re.compile(r' [\w\-]+\(([^)]*)\)')
_FUSED = re.compile(r' fusion\(.*\bcalls=%?([\w.\-]+)')
# Instructions that move no bytes of their own.
_FREE = {'parameter', 'constant', 'tuple', 'get-tuple-element', 'bitcast',
         'while', 'call', 'conditional', 'after-all', 'partition-id',
         'replica-id', 'iota', 'opt-barrier'}
# Custom calls that move no bytes: a TPU's buffer allocation (the zeroed
# stack a scanned layer's saved activations go into is never written
# whole) and its bitcast of a concatenation.
_FREE_TARGETS = ('"AllocateBuffer"', '"ConcatBitcast"')
# Fused attention as each compiler calls it: cuDNN's on GPUs, a Mosaic
# (Pallas) kernel on TPUs.
_KERNELS = {'cudnn': re.compile(r'custom_call_target="__cudnn\$fmha'),
            'pallas': re.compile(r'custom_call_target="tpu_custom_call"')}


def _dims(shape_text: str) -> list[int]:
  """The dimensions of the first array in an HLO shape."""
  found = _ARRAY.search(shape_text)
  return [int(d) for d in found.group(2).split(',') if d] if found else []


def _arrays(shape_text: str) -> list[tuple[int, bool]]:
  """(bytes, in HBM) of each array in an HLO shape. A layout's ``S(1)``
  is XLA's alternate memory space: a TPU's on-chip memory, where its
  compiler places the buffers it prefetches (memory space assignment)."""
  out = []
  for dtype, dims, layout in _ARRAY.findall(shape_text):
    n = int(np.prod([int(d) for d in dims.split(',') if d] or [1]))
    bits = 8 if dtype == 'pred' else int(re.sub(r'\D', '', dtype) or 8)
    out.append((n * bits // 8, _ON_CHIP not in layout))
  return out


def _bytes(shape_text: str, hbm: bool = False) -> int:
  """Bytes of the largest array in an HLO shape (a tuple's elements are
  the operands and results of an asynchronous collective: one moves);
  ``hbm``: of the largest array in HBM (0 when all are on chip)."""
  return max((n for n, in_hbm in _arrays(shape_text) if in_hbm or not hbm),
             default=0)


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


@functools.lru_cache(maxsize=4)
def _parsed(hlo: str) -> tuple[dict[str, list[str]], dict[str, int]]:
  """(each computation's instruction lines, how many times each runs per
  step), parsed once for all the figures read from one module."""
  comps, entry = _computations(hlo)
  return comps, (_runs(comps, entry) if entry else {})


def _instructions(comps: dict[str, list[str]]):
  """(computation, op, result shape text, line) of every instruction."""
  for name, lines in comps.items():
    for line in lines:
      match = _INSTRUCTION.match(line)
      if match:
        yield name, match.group(2), match.group(1), line


def _matmul_flops(op: str, shape: str, line: str,
                  shapes: dict[str, str]) -> float:
  """2 x multiply-adds of a dot or a cuBLAS call (result x contracted
  size) or of a convolution."""
  if op == 'dot' or (op == 'custom-call' and _GEMM.search(line)):
    operand = _DOT.search(line) or _CALL_LHS.search(line)
    contracting = (_LHS_CONTRACTING.search(line)
                   or _GEMM_CONTRACTING.search(line))
    if not operand or not contracting:
      return 0.0
    lhs = _dims(shapes.get(operand.group(1), ''))
    dims = re.findall(r'\d+', contracting.group(1))
    per_output = np.prod([lhs[int(i)] for i in dims if int(i) < len(lhs)]
                         or [1])
  elif op == 'convolution':
    return _convolution_flops(shape, line, shapes)
  else:
    return 0.0
  return 2.0 * float(np.prod(_dims(shape) or [1])) * float(per_output)


def _convolution_flops(shape: str, line: str, shapes: dict[str, str]
                       ) -> float:
  """2 x multiply-adds of a convolution that land on its input, not on
  its padding (a TPU writes a matmul over heads as a window padded to
  16x its input): out batch x out features x in features x, per spatial
  dimension, the window positions inside the input summed over outputs."""
  operands = _CONVOLUTION_OPERANDS.search(line)
  labels = _DIM_LABELS.search(line)
  if not operands or not labels:
    return 0.0
  lhs = _dims(shapes.get(operands.group(1), ''))
  rhs = _dims(shapes.get(operands.group(2), ''))
  out = _dims(shape)
  lhs_l, rhs_l, out_l = labels.groups()
  if not (len(lhs) == len(lhs_l) and len(rhs) == len(rhs_l)
          and len(out) == len(out_l)):
    return 0.0
  window = _WINDOW.search(line)
  fields = dict(f.split('=', 1) for f in window.group(1).split()) \
      if window else {}
  macs = float(out[out_l.index('b')] * out[out_l.index('f')]
               * rhs[rhs_l.index('i')])
  for label in (c for c in out_l if c.isdigit()):
    size = int(fields['size'].split('x')[int(label)]) if 'size' in fields \
        else 1
    lo = int(fields['pad'].split('x')[int(label)].split('_')[0]) \
        if 'pad' in fields else 0
    stride = int(fields['stride'].split('x')[int(label)]) \
        if 'stride' in fields else 1
    n, outputs = lhs[lhs_l.index(label)], out[out_l.index(label)]
    starts = np.arange(outputs) * stride - lo
    inside = np.minimum(size, n - starts) - np.maximum(0, -starts)
    macs *= float(np.clip(inside, 0, None).sum())
  return 2.0 * macs


def dot_flops(hlo: str) -> tuple[float, float]:
  """Matmul FLOPs of the HLO's ``dot``, ``convolution`` and cuBLAS calls:
  (per step, each computation counted once as ``cost_analysis()`` counts
  it). A rematerialized matmul counts each time it runs. The ratio of the
  two is how much XLA's cost figures undercount a step with loops."""
  comps, runs = _parsed(hlo)
  shapes = {}
  for _, _, shape, line in _instructions(comps):
    shapes[_NAME.match(line).group(1)] = shape
  per_step = once = 0.0
  for name, op, shape, line in _instructions(comps):
    flops = _matmul_flops(op, shape, line, shapes)
    once += flops
    per_step += flops * runs.get(name, 0)
  return per_step, once


def memory_bytes(hlo: str) -> tuple[float, float]:
  """Bytes the HLO's kernels (each instruction outside a fusion: its
  operands and result) move: (to and from HBM per step, every operand and
  result with each computation counted once). A slice of a stacked array
  (a scanned layer's weights, a layer's saved activations) reads the
  slice, an update in place writes the update, also where a fusion does
  them (``_fusion_io``). A buffer a TPU's compiler placed on chip
  (``S(1)``) moves no HBM bytes; copying it in or out moves its HBM side.
  Rough per instruction; its use is the ratio of the two, which scales
  XLA's figure (every operand and result, each body once) to a step's HBM
  traffic."""
  per_step = once = 0.0
  for _, _, moved, moved_once in _kernel_bytes(hlo):
    per_step += moved
    once += moved_once
  return per_step, once


def bytes_without_math(hlo: str) -> float:
  """HBM bytes per step (as ``memory_bytes`` counts them) of the kernels
  that do no matmul: the fusions of norms, residual adds, activations,
  layout changes and the optimizer, and copies. A step's kernels run one
  after another, and a kernel's traffic can hide only behind its own
  math: these bytes are time no matmul hides. Not counted here: the
  collectives (their time is their links') and the asynchronous copies a
  TPU prefetches with (``copy-start``, ``slice-start``: they run beside
  the kernels)."""
  comps, _ = _parsed(hlo)
  math = _with_math(comps)
  return sum(moved for _, line, moved, _ in _kernel_bytes(hlo)
             if not _does_math(line, comps, math)
             and not _beside_kernels(line))


def _beside_kernels(line: str) -> bool:
  """A collective or an asynchronous copy: work that does not hold the
  chip's cores as a kernel does."""
  if _TPU_ASYNC.match(line):
    return True
  match = _INSTRUCTION.match(line)
  op = match.group(2) if match else ''
  return (op.removesuffix('-start') in COLLECTIVES
          or op in ('copy-start', 'slice-start', 'async-start'))


def _does_math(line: str, comps: dict[str, list[str]], math: set[str]
               ) -> bool:
  """Whether the kernel of this line is a matmul, an attention kernel, or
  a fusion (or call) of a computation that holds one."""
  match = _INSTRUCTION.match(line)
  op = match.group(2) if match else ''
  if op in ('dot', 'convolution') or (op == 'custom-call' and (
      _GEMM.search(line) or any(k.search(line) for k in _KERNELS.values()))):
    return True
  return any(called in math for _, called in _CALLED.findall(line))


def _with_math(comps: dict[str, list[str]]) -> set[str]:
  """The computations that hold a matmul or an attention kernel, directly
  or in a computation they call."""
  direct, calls = set(), {}
  for name, lines in comps.items():
    calls[name] = set()
    for line in lines:
      match = _INSTRUCTION.match(line)
      op = match.group(2) if match else ''
      if op in ('dot', 'convolution') or (op == 'custom-call' and (
          _GEMM.search(line)
          or any(k.search(line) for k in _KERNELS.values()))):
        direct.add(name)
      calls[name].update(c for _, c in _CALLED.findall(line))
  math, changed = set(direct), True
  while changed:
    changed = False
    for name, called in calls.items():
      if name not in math and called & math:
        math.add(name)
        changed = True
  return math


def _kernel_bytes(hlo: str):
  """(computation, line, HBM bytes per step, bytes with each computation
  once) of every kernel: each instruction outside a fusion that moves
  bytes (``memory_bytes``)."""
  comps, runs = _parsed(hlo)
  fused = {m.group(1) for lines in comps.values() for line in lines
           for m in [_FUSED.search(line)] if m}
  sizes, in_hbm, roots = {}, {}, {}
  for name, op, shape, line in _instructions(comps):
    instruction = _NAME.match(line).group(1)
    sizes[instruction] = _bytes(shape)
    in_hbm[instruction] = _bytes(shape, hbm=True)
    if line.lstrip().startswith('ROOT'):
      roots[name] = op
  io: dict[str, tuple[dict[int, int], int | None]] = {}
  for name in fused:
    if name in comps:
      _fusion_io(name, comps, sizes, io)
  for name, op, shape, line in _instructions(comps):
    if name in fused or op in _FREE or op.endswith('-done') or (
        op == 'custom-call' and _moves_nothing(line)):
      continue
    called = _FUSED.search(line).group(1) if op == 'fusion' else None
    kernel = (op, roots.get(called) if called else op, shape,
              io.get(called, ({}, None)))
    operands = _operand_names(line)
    yield (name, line,
           _moved(*kernel, [in_hbm.get(o, 0) for o in operands], True)
           * runs.get(name, 0),
           _moved(*kernel, [sizes.get(o, 0) for o in operands], False))


def _moved(op: str, kind: str, shape: str,
           io: tuple[dict[int, int], int | None], read: list[int],
           hbm: bool) -> int:
  """Bytes one kernel moves: its operands' bytes ``read`` (0 for one on
  chip where ``hbm``), its fused slices and in-place updates ``io``, its
  result ``shape``."""
  out = _bytes(shape, hbm)
  reads, written = io
  if op in ('slice-start', 'copy-start'):
    # ((operand), result, context): an asynchronous copy of the result
    # (a TPU's prefetch of a slice into its on-chip memory, or an
    # eviction from it): a side on chip moves nothing from HBM.
    arrays = _arrays(shape)[:2]
    if len(arrays) < 2:
      return out
    copied = arrays[1][0]
    return copied * sum(in_hbm or not hbm for _, in_hbm in arrays)
  if reads or written is not None:
    return sum(reads.get(i, n) if n else 0 for i, n in enumerate(read)) + (
        out if written is None or not out else written)
  if kind == 'dynamic-update-slice':
    return 2 * (sum(read) - max(read, default=0))
  if kind == 'dynamic-slice':
    return 2 * out
  return out + sum(read)


def _moves_nothing(line: str) -> bool:
  """A custom call of one of _FREE_TARGETS."""
  return any(f'custom_call_target={t}' in line for t in _FREE_TARGETS)


_COMMENT = re.compile(r'/\*.*?\*/')
_PARAMETER = re.compile(r' parameter\((\d+)\)')
_SLICES = ('dynamic-slice', 'slice', 'gather')


def _operand_names(line: str) -> list[str]:
  """The instruction's operands' names."""
  operands = _OPERANDS.search(_COMMENT.sub('', line))
  return [o.strip().lstrip('%').split(' ')[-1].lstrip('%')
          for o in (operands.group(1).split(',') if operands else [])
          if o.strip()]


def _fusion_io(called: str, comps: dict[str, list[str]],
               sizes: dict[str, int],
               io: dict[str, tuple[dict[int, int], int | None]]
               ) -> tuple[dict[int, int], int | None]:
  """What the fused computation ``called`` reads and writes where it
  slices or updates in place: ({parameter index: bytes read} for a
  parameter only sliced (its slices' bytes) or only updated in place
  (none), bytes written when its root is an in-place update (the
  updates'), else None). A fusion nested inside it counts as the slices
  and updates it does (a TPU nests a layer's slice of a stacked array in
  the fusion that uses it). Memoised in ``io``."""
  if called in io:
    return io[called]
  params, uses, ops, root = {}, {}, {}, None
  for line in comps[called]:
    name = _NAME.match(line)
    match = _INSTRUCTION.match(line)
    if not name or not match:
      continue
    name, op = name.group(1), match.group(2)
    ops[name] = (op, line)
    if line.lstrip().startswith('ROOT'):
      root = name
    parameter = _PARAMETER.search(line)
    if op == 'parameter' and parameter:
      params[name] = int(parameter.group(1))
      continue
    nested = _nested_io(op, line, comps, sizes, io)
    for position, operand in enumerate(_operand_names(line)):
      if operand in params:
        uses.setdefault(operand, []).append(
            _use(op, position, sizes.get(name, 0), nested))
  reads = {}
  for name, index in params.items():
    used = uses.get(name, [])
    if used and all(op in _SLICES and pos == 0 for op, pos, _ in used):
      reads[index] = sum(n for _, _, n in used)
    elif used and all(op == 'dynamic-update-slice' and pos == 0
                      for op, pos, _ in used):
      reads[index] = 0
  io[called] = (reads, _written(root, ops, comps, sizes, io))
  return io[called]


def _nested_io(op: str, line: str, comps: dict[str, list[str]],
               sizes: dict[str, int], io: dict
               ) -> tuple[dict[int, int], int | None] | None:
  """_fusion_io of the computation a nested fusion instruction calls."""
  called = _FUSED.search(line) if op == 'fusion' else None
  if called is None or called.group(1) not in comps:
    return None
  return _fusion_io(called.group(1), comps, sizes, io)


def _use(op: str, position: int, out: int, nested) -> tuple[str, int, int]:
  """(op, operand position, bytes) of one use of a fused parameter; a
  nested fusion's use as the slice or in-place update it does there."""
  if nested is not None and position in nested[0]:
    read = nested[0][position]
    return ('slice', 0, read) if read else ('dynamic-update-slice', 0, 0)
  return op, position, out


def _written(root: str | None, ops: dict[str, tuple[str, str]],
             comps: dict[str, list[str]], sizes: dict[str, int],
             io: dict) -> int | None:
  """Bytes a fused computation writes when its root (or an element of its
  root tuple) is an in-place update, directly or in a nested fusion: the
  updates' bytes; else None."""
  if root is None:
    return None
  op, line = ops[root]
  elements = _operand_names(line) if op == 'tuple' else [root]
  updates = {}
  for element in elements:
    kind, text = ops.get(element, ('', ''))
    names = _operand_names(text)
    if kind == 'dynamic-update-slice' and len(names) > 1:
      updates[element] = sizes.get(names[1], 0)
    nested = _nested_io(kind, text, comps, sizes, io)
    if nested is not None and nested[1] is not None:
      updates[element] = nested[1]
  if not updates:
    return None
  return sum(updates.get(e, sizes.get(e, 0)) for e in elements)


def link_bytes(moved: dict[str, int]) -> float:
  """Bytes a chip sends over its links for collective_bytes' figures: an
  all-reduce sends and receives each byte about twice (a ring)."""
  return 2 * moved['all-reduce'] + sum(
      v for k, v in moved.items() if k != 'all-reduce')


def collective_bytes(hlo: str) -> dict[str, int]:
  """Bytes per step of each collective kind (the largest array each
  instruction moves, times the runs of its computation; a TPU's
  asynchronous collective once, not once per fusion that holds a copy of
  it)."""
  comps, runs = _parsed(hlo)
  copies = _async_copies(comps)
  totals = dict.fromkeys(COLLECTIVES, 0)
  for name, op, shape, _ in _instructions(comps):
    kind = op.removesuffix('-start')
    if kind in totals and not op.endswith('-done') and name not in copies:
      totals[kind] += _bytes(shape) * runs.get(name, 0)
  return totals


def collective_bytes_by_axes(hlo: str, axes: dict[str, int]
                             ) -> dict[str, int]:
  """Bytes per step of the collectives (as :func:`collective_bytes` counts
  them, every kind together) by the mesh axes their groups span, e.g.
  {'fsdp': n, 'sequence': m, 'fsdp+sequence': k}: axes {name: size} in the
  mesh's order, partition p at the mesh position of its index (a jit's
  devices in the mesh's order). Groups not read here count as 'unread'."""
  comps, runs = _parsed(hlo)
  copies = _async_copies(comps)
  out: dict[str, int] = {}
  for name, op, shape, line in _instructions(comps):
    kind = op.removesuffix('-start')
    if kind not in COLLECTIVES or op.endswith('-done') or name in copies:
      continue
    key = _axes_spanned(replica_groups(line), axes)
    out[key] = out.get(key, 0) + _bytes(shape) * runs.get(name, 0)
  return out


def _axes_spanned(groups: list[list[int]] | None,
                  axes: dict[str, int]) -> str:
  """The mesh axes along which the members of some group differ, joined
  by '+' ('unread' for groups not read; [] is every partition)."""
  if groups is None:
    return 'unread'
  names, sizes = list(axes), list(axes.values())
  if not groups:
    return '+'.join(n for n, size in zip(names, sizes) if size > 1)
  spanned = set()
  for group in groups:
    if any(p >= math.prod(sizes) for p in group):
      return 'unread'
    coords = np.unravel_index(np.asarray(group), sizes)
    spanned.update(i for i, c in enumerate(coords) if len(set(c)) > 1)
  return '+'.join(names[i] for i in sorted(spanned)) or 'none'


def collective_launches(hlo: str) -> int:
  """Collectives started per step (each instruction times its runs)."""
  comps, runs = _parsed(hlo)
  copies = _async_copies(comps)
  return sum(runs.get(name, 0) for name, op, _, _ in _instructions(comps)
             if op.removesuffix('-start') in COLLECTIVES
             and name not in copies)


def _async_copies(comps: dict[str, list[str]]) -> set[str]:
  """The computations of a TPU's asynchronous collectives that repeat the
  collective its start fusion holds: the ``async_collective_fusion``
  computations between start and done, and the done fusion's."""
  copies = {name for name in comps
            if name.startswith(_TPU_ASYNC_COMPUTATION)}
  for lines in comps.values():
    for line in lines:
      tpu = _TPU_ASYNC.match(line)
      if tpu and tpu.group(1) == 'done':
        copies.update(c for _, c in _CALLED.findall(line))
  return copies


def attention_kernels(hlo: str) -> list[str]:
  """The fused attention kernels the HLO calls ('cudnn', 'pallas')."""
  return [name for name, pattern in _KERNELS.items() if pattern.search(hlo)]


# A TPU's asynchronous collectives: fusions named async-collective-start
# and -done (their computations call the AsyncCollectiveStart and
# AsyncCollectiveDone custom calls) and the async_collective_fusion
# computations between them, which overlap compute with the transfer.
_TPU_ASYNC = re.compile(r'^\s*(?:ROOT )?%?async-collective-(start|done)[\w.\-]* = ')
_TPU_ASYNC_COMPUTATION = 'async_collective_fusion'


def async_collectives(hlo: str) -> dict[str, dict[str, int]]:
  """How the compiler scheduled each collective kind: {'async': {kind:
  instructions}, 'sync': {kind: instructions}, 'pairs': {'start': n,
  'done': n}} (each instruction once, not per loop trip).

  Asynchronous is a start/done pair the scheduler may put compute
  between: XLA:GPU's ``all-gather-start``/``all-gather-done`` (and
  ``async-start``/``async-done`` wrapping a collective); a TPU's async
  collective fusions (``async-collective-start``/``-done``, and the
  ``async_collective_fusion`` computations that run between them).
  """
  comps, _ = _parsed(hlo)
  inside = set()
  pairs = {'start': 0, 'done': 0}
  for lines in comps.values():
    for line in lines:
      tpu = _TPU_ASYNC.match(line)
      match = _INSTRUCTION.match(line)
      op = match.group(2) if match else ''
      if tpu or op == 'async-start':
        inside.update(c for _, c in _CALLED.findall(line))
      kinds = COLLECTIVES + ('async',)
      if tpu:
        pairs[tpu.group(1)] += 1
      elif op.endswith('-start') and op.removesuffix('-start') in kinds:
        pairs['start'] += 1
      elif op.endswith('-done') and op.removesuffix('-done') in kinds:
        pairs['done'] += 1
  counts = {'async': dict.fromkeys(COLLECTIVES, 0),
            'sync': dict.fromkeys(COLLECTIVES, 0), 'pairs': pairs}
  copies = _async_copies(comps)
  for name, op, _, _ in _instructions(comps):
    kind = op.removesuffix('-start')
    if kind not in COLLECTIVES or name in copies:
      continue
    is_async = op.endswith('-start') or name in inside
    counts['async' if is_async else 'sync'][kind] += 1
  return counts


# How a collective names the devices that take part in it (partition ids,
# in the order of the mesh's devices): a list of groups, an iota of groups
# ([groups, size]<=[dims]T(perm)), a mesh's axes, or a permute's pairs.
_GROUP_LIST = re.compile(r'replica_groups=\{((?:\{[\d,]*\},?)*)\}')
_GROUP_IOTA = re.compile(
    r'replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?')
_GROUP_MESH = re.compile(
    r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\]"
    r"(?:T\(([\d,]+)\))?\))? \{([^}]*)\}")
_PAIRS = re.compile(r'source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}')
LINK_CLASSES = ('sync', 'sync_cross', 'async', 'async_cross')
# A TPU's transfer between slices, handed to the host's runtime.
_MEGASCALE = '_xla_host_transfer_handler_name="xla_megascale_runtime"'


def _iota(dims: list[int], perm: list[int] | None) -> np.ndarray:
  ids = np.arange(int(np.prod(dims))).reshape(dims)
  return ids.transpose(perm) if perm else ids


def _ints(text: str | None) -> list[int]:
  return [int(n) for n in text.split(',') if n] if text else []


def replica_groups(line: str) -> list[list[int]] | None:
  """The groups of partitions a collective runs over (a permute: its
  source and target pairs); [] for one group of every partition; None
  where the line says it in a form not read here."""
  pairs = _PAIRS.search(line)
  if pairs:
    return [_ints(p) for p in re.findall(r'\{([\d,]+)\}', pairs.group(1))]
  found = _GROUP_LIST.search(line)
  if found:
    return [_ints(g) for g in re.findall(r'\{([\d,]*)\}', found.group(1))
            if g]
  found = _GROUP_IOTA.search(line)
  if found:
    groups, size = int(found.group(1)), int(found.group(2))
    ids = _iota(_ints(found.group(3)), _ints(found.group(4)) or None)
    return ids.reshape(groups, size).tolist()
  found = _GROUP_MESH.search(line)
  if found:
    axes = re.findall(r"'([^']+)'=(\d+)", found.group(1))
    if not axes:
      return None
    names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
    ids = (_iota(_ints(found.group(2)), _ints(found.group(3)) or None)
           .reshape(-1) if found.group(2) else np.arange(int(np.prod(sizes))))
    ids = ids.reshape(sizes)
    over = [names.index(a) for a in re.findall(r"'([^']+)'", found.group(4))
            if a in names]
    if not over:
      return None
    rest = [i for i in range(len(names)) if i not in over]
    size = int(np.prod([sizes[i] for i in over]))
    return ids.transpose(rest + over).reshape(-1, size).tolist()
  return None


def crosses(line: str, islands: list[int] | None) -> bool:
  """Whether the collective of this line joins partitions of different
  islands (``islands[p]``: the host, on GPUs, or the slice, on TPUs, of
  partition p), so that its bytes cross the network between them. A form
  of groups not read here counts as crossing."""
  if not islands or len(set(islands)) < 2:
    return False
  groups = replica_groups(line)
  if not groups:  # one group of all, or unread
    return True
  for group in groups:
    if any(p >= len(islands) for p in group):
      return True
    if len({islands[p] for p in group}) > 1:
      return True
  return False


def _is_done_of(line: str, start: str) -> bool:
  match = _INSTRUCTION.match(line)
  op = match.group(2) if match else ''
  tpu = _TPU_ASYNC.match(line)
  done = (tpu and tpu.group(1) == 'done') or op.endswith('-done')
  return bool(done) and start in _operand_names(line)


def collective_links(hlo: str, islands: list[int] | None = None
                     ) -> dict[str, float]:
  """Link bytes per step (as ``link_bytes`` counts them: an all-reduce
  twice) in four classes: ``sync`` and ``async`` by whether the schedule
  puts a kernel with math (``_does_math``) between the collective's start
  and its done (XLA:GPU's ``*-start``/``*-done`` and ``async-start``, a
  TPU's ``async-collective-start``/``-done`` fusions; a collective
  outside such a pair, or with nothing to hide behind, is ``sync``), and
  ``_cross`` where it joins partitions of different islands
  (``crosses``), as does a TPU's transfer between slices (a ``send`` to
  the Megascale runtime, the compiler's half of a collective over the
  data-center network: its bytes, twice for an all-reduce's)."""
  comps, runs = _parsed(hlo)
  copies = _async_copies(comps)
  math = _with_math(comps)
  hidden_starts, hidden_calls = set(), set()
  for lines in comps.values():
    for i, line in enumerate(lines):
      match = _INSTRUCTION.match(line)
      op = match.group(2) if match else ''
      tpu = _TPU_ASYNC.match(line)
      if not ((tpu and tpu.group(1) == 'start') or _MEGASCALE in line and (
          op == 'send') or (
          op.endswith('-start')
          and op.removesuffix('-start') in COLLECTIVES + ('async',))):
        continue
      start = _NAME.match(line).group(1)
      for later in lines[i + 1:]:
        if _is_done_of(later, start):
          break
        if _does_math(later, comps, math):
          hidden_starts.add(start)
          hidden_calls.update(c for _, c in _CALLED.findall(line))
          break
  out = dict.fromkeys(LINK_CLASSES, 0.0)
  for name, op, shape, line in _instructions(comps):
    if op == 'send' and _MEGASCALE in line:
      # A TPU's collective between slices: each chip's share handed to
      # the host's Megascale runtime, which moves it over the data-center
      # network (an all-reduce's share goes and comes back).
      twice = 'rendezvous="all-reduce' in line
      key = ('async' if _NAME.match(line).group(1) in hidden_starts
             else 'sync') + '_cross'
      out[key] += _bytes(shape) * runs.get(name, 0) * (2 if twice else 1)
      continue
    kind = op.removesuffix('-start')
    if kind not in COLLECTIVES or op.endswith('-done') or name in copies:
      continue
    moved = _bytes(shape) * runs.get(name, 0) * (
        2 if kind == 'all-reduce' else 1)
    hidden = (_NAME.match(line).group(1) in hidden_starts
              or name in hidden_calls)
    key = ('async' if hidden else 'sync') + (
        '_cross' if crosses(line, islands) else '')
    out[key] += moved
  return out
