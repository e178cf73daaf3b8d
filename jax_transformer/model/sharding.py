"""Device mesh, logical-axis rules and the pre-flight sharding report.

Model code names logical axes ('embed', 'mlp', 'heads', ...); one rules table
maps them to the mesh axes ('data', 'fsdp', 'sequence', 'tensor'). Batches
are split over ('data', 'fsdp'); parameters are split over 'fsdp' (ZeRO-3
style) and 'tensor' (Megatron style). Activations are pinned by the same
table (:func:`constrain`): the batch over ('data', 'fsdp'), a row's
positions ('length') over 'sequence' (context parallelism: attention
gathers keys and values over it, ``attention.Attention.attend``), heads,
MLP features and the vocabulary over 'tensor'; 'embed' stays whole in an
activation because its batch already took 'fsdp'.

Over several TPU slices (or GPU hosts) the mesh is hybrid: the same block
in each, on its fast links, and only 'data' and 'fsdp' crossing the
data-center network between them, as ``mesh.dcn_data`` and
``mesh.dcn_fsdp`` say ('data' first by default; :func:`make_mesh`):
'sequence' and 'tensor' talk every layer, so they stay inside a slice.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_transformer import fields
from jax_transformer.errors import UsageError

# 'sequence' sits beside 'tensor', inside a slice: both exchange
# activations in every layer, where 'data' and 'fsdp' exchange weights.
MESH_AXES = ('data', 'fsdp', 'sequence', 'tensor')
BATCH_AXES = ('data', 'fsdp')
# A batch's tokens as rows [B * T] (:func:`token_rows`): the positions'
# split outermost, so that each device's tokens are one block of rows.
TOKEN_AXES = ('sequence', 'data', 'fsdp')

# Logical axis -> mesh axis or axes (None: replicated).
DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    'batch': BATCH_AXES,
    'length': 'sequence',
    # Keys and values as attention reads them: every position of the row
    # on every device, whatever 'length' says of the queries.
    'kv_length': None,
    'tokens': TOKEN_AXES,
    'layers': None,
    'vocab': 'tensor',
    'embed': 'fsdp',
    'mlp': 'tensor',
    'heads': 'tensor',
    'kv_heads': 'tensor',
    'head_dim': None,
    'norm': None,
    'position': None,
}


def mesh_shape(sizes: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
  """Resolves one -1 ('the rest') and checks the product is num_devices."""
  shape = [int(sizes.get(axis, 1)) for axis in MESH_AXES]
  if shape.count(-1) > 1:
    raise UsageError(f'At most one mesh axis may be -1, got {dict(sizes)}.')
  if any(s == 0 or s < -1 for s in shape):
    raise UsageError(f'Mesh axis sizes must be positive or -1, got '
                     f'{dict(sizes)}.')
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise UsageError(f'Mesh {dict(sizes)} does not divide the '
                       f'{num_devices} devices.')
    shape[shape.index(-1)] = num_devices // known
  if math.prod(shape) != num_devices:
    raise UsageError(
        f'Mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} '
        f'devices but {num_devices} are available; make the mesh sizes '
        f'multiply to {num_devices}, or set one of them to -1.')
  return tuple(shape)


# How many parts of the 'data' and 'fsdp' axes lie in different slices (TPU)
# or hosts (GPU): their product is the number of slices or hosts, and only
# these axes cross the data-center network ('tensor' never does). 0 for
# both: automatic, 'data' as far as it is a multiple of their number, then
# 'fsdp'.
DCN_FIELDS = ('dcn_data', 'dcn_fsdp')


def make_mesh(sizes: Mapping[str, int],
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'sequence', 'tensor') mesh over all (or the given)
  devices (an axis sizes leaves out is 1).

  Devices in several slices (TPU: ``slice_index``) or on several hosts (GPU:
  ``process_index``, where each process holds more than one GPU) get a
  hybrid mesh (``mesh_utils.create_hybrid_device_mesh``): each slice or host
  holds the same block of the mesh, laid out on its fast links (ICI,
  NVLink), and only 'data' and 'fsdp' cross between them ('sequence' and
  'tensor' stay on the fast links), in the outer part
  of each, as ``sizes['dcn_data']`` and ``sizes['dcn_fsdp']`` say. The run
  (``run_plan.mesh_for``) and the compile for a target
  (``compile.lowering.lower_train``) both build their mesh here, so what a
  target's compiler proved is what runs.
  """
  devices = list(jax.devices() if devices is None else devices)
  dcn_counts(sizes)
  shape = mesh_shape(sizes, len(devices))
  units = granules(devices)
  ici, dcn = hybrid_shape(sizes, shape, units)
  return Mesh(mesh_devices(ici, dcn, devices, by_host=units[0] == 'host'),
              MESH_AXES,
              axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def granules(devices: Sequence[jax.Device]) -> tuple[str, int]:
  """('slice', n) or ('host', n): the units the slow network joins."""
  slices = {getattr(d, 'slice_index', None) for d in devices} - {None}
  if len(slices) > 1:
    return 'slice', len(slices)
  if devices and devices[0].platform in ('gpu', 'cuda', 'rocm'):
    per_process: dict[int, int] = {}
    for d in devices:
      per_process[d.process_index] = per_process.get(d.process_index, 0) + 1
    # One GPU per process (SLURM's one task per GPU) tells nothing of hosts:
    # the devices' own order (XLA numbers a host's GPUs together) is kept.
    if len(per_process) > 1 and min(per_process.values()) > 1:
      return 'host', len(per_process)
  return 'slice', 1


def dcn_counts(sizes: Mapping[str, int]) -> tuple[int, int]:
  """(dcn_data, dcn_fsdp) of sizes (0: automatic), each refused in one
  sentence when it is not an integer >= 0."""
  counts = []
  for name in DCN_FIELDS:
    counts.append(fields.check_integer(
        f'config.mesh.{name}', sizes.get(name, 0) or 0, 0,
        ' (how many slices or hosts that axis spans; 0 for both: '
        'automatic)'))
  return counts[0], counts[1]


def hybrid_shape(sizes: Mapping[str, int], shape: Sequence[int],
                 units: tuple[str, int]
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(per-slice shape, across-slices shape) of the mesh shape: their
  product is shape, and the second splits only 'data' and 'fsdp'."""
  counts = dcn_counts(sizes)
  n = units[1]
  what = f'{units[0]}s' if n > 1 else units[0]
  data, fsdp = shape[0], shape[1]
  inner = (1,) * (len(shape) - 2)  # 'sequence' and 'tensor' never cross
  if counts == (0, 0):
    if n == 1:
      return tuple(shape), (1, 1) + inner
    dcn_data = math.gcd(data, n)
    dcn = (dcn_data, n // dcn_data) + inner
    if fsdp % dcn[1]:
      raise UsageError(
          f'Mesh {dict(zip(MESH_AXES, shape))} cannot be split over the {n} '
          f'{what} with only data and fsdp crossing between them: make '
          f'config.mesh.data x config.mesh.fsdp ({data} x {fsdp}) a multiple '
          f'of {n} (sequence and tensor parallelism stay inside a slice or '
          'host).')
  else:
    dcn = (max(counts[0], 1), max(counts[1], 1)) + inner
    if dcn[0] * dcn[1] != n or data % dcn[0] or fsdp % dcn[1]:
      raise UsageError(
          f'config.mesh.dcn_data={counts[0]} and dcn_fsdp={counts[1]} do '
          f'not fit mesh {dict(zip(MESH_AXES, shape))} on {n} {what}: their '
          f'product must be {n}, each dividing its axis (or both 0: '
          'automatic).')
  return (data // dcn[0], fsdp // dcn[1], *shape[2:]), dcn


def spans(mesh: Mesh) -> dict[str, int]:
  """How many slices (or hosts) each mesh axis spans: 1 for an axis that
  stays on one slice's fast links."""
  kind, n = granules(list(mesh.devices.flat))
  if n == 1:
    return {axis: 1 for axis in mesh.axis_names}
  key = ((lambda d: d.slice_index) if kind == 'slice'
         else (lambda d: d.process_index))
  owner = np.vectorize(key, otypes=[int])(mesh.devices)
  out = {}
  for i, axis in enumerate(mesh.axis_names):
    along = np.moveaxis(owner, i, 0).reshape(owner.shape[i], -1)
    out[axis] = max(len(set(column)) for column in along.T)
  return out


def mesh_devices(ici: Sequence[int], dcn: Sequence[int],
                 devices: Sequence[jax.Device],
                 by_host: bool = False) -> np.ndarray:
  """The devices as an array of shape ici x dcn (axis by axis): on a TPU
  laid out on the chips' torus, on GPUs by XLA's device numbering; slice by
  slice (by_host: process by process) when dcn is not all ones."""
  if math.prod(dcn) > 1:
    return mesh_utils.create_hybrid_device_mesh(
        ici, dcn, devices, process_is_granule=by_host,
        allow_split_physical_axes=True)
  if devices[0].platform in ('tpu', 'gpu'):
    return mesh_utils.create_device_mesh(ici, devices,
                                         allow_split_physical_axes=True)
  return np.asarray(devices).reshape(ici)


def logical_to_spec(axes: Sequence[str],
                    rules: Mapping[str, str | tuple[str, ...] | None]
                    = DEFAULT_RULES) -> PartitionSpec:
  """('embed', 'mlp') -> PartitionSpec('fsdp', 'tensor'); a mesh axis is
  used at most once per array (the first dimension that asks gets it)."""
  used, spec = set(), []
  for name in axes:
    wanted = rules.get(name)
    wanted = (wanted,) if isinstance(wanted, str) else tuple(wanted or ())
    free = tuple(a for a in wanted if a not in used)
    used.update(free)
    spec.append(free[0] if len(free) == 1 else (free or None))
  return PartitionSpec(*spec)


def _mesh_axes(mesh, dim: int, entry) -> tuple[str, ...]:
  """The mesh axes of a spec entry that split a dimension of size dim
  under mesh: those the mesh has, larger than 1 (an axis of one device
  splits nothing, and leaving it out keeps a spec the same with or without
  it), or none where their product does not divide dim."""
  names = (entry,) if isinstance(entry, str) else tuple(entry or ())
  names = tuple(a for a in names
                if a in mesh.axis_names and mesh.shape[a] > 1)
  if names and dim % math.prod(mesh.shape[a] for a in names):
    return ()
  return names


def constrain(x: jax.Array, axes: Sequence[str],
              rules: Mapping[str, str | tuple[str, ...] | None]
              = DEFAULT_RULES) -> jax.Array:
  """x laid out by its logical axes (one name per dimension), when traced
  under a mesh (``jax.set_mesh`` or ``jax.sharding.use_abstract_mesh``);
  unchanged otherwise.

  Without this the compiler propagates layouts from the parameters and may
  pick one that gathers a whole batch or all heads on every device. Mesh
  axes the current mesh lacks, of size 1, or that do not divide their
  dimension, are dropped (the dimension is then replicated over them).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = []
  for dim, entry in zip(x.shape, logical_to_spec(axes, rules)):
    names = _mesh_axes(mesh, dim, entry)
    spec.append(names[0] if len(names) == 1 else (names or None))
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def splits(name: str, dim: int,
           rules: Mapping[str, str | tuple[str, ...] | None]
           = DEFAULT_RULES) -> int:
  """Into how many parts :func:`constrain` splits a dimension of size dim
  named ``name`` under the mesh in context (1 without one): how model code
  asks whether, say, a row's positions are split, without naming a mesh
  axis."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1
  return math.prod(mesh.shape[a]
                   for a in _mesh_axes(mesh, dim, rules.get(name)))


def _manual_spec(mesh, shape: Sequence[int],
                axes: Sequence[tuple[str, ...]]) -> PartitionSpec:
  """A ``jax.shard_map`` spec: the mesh axes named for each dimension of
  shape, dropped where the mesh lacks them or they do not divide it."""
  spec = []
  for dim, names in zip(shape, axes):
    names = tuple(a for a in names if a in mesh.axis_names)
    if names and dim % math.prod(mesh.shape[a] for a in names):
      names = ()
    spec.append(names or None)
  return PartitionSpec(*spec)


def attention_specs(mesh, q_shape: Sequence[int], kv_shape: Sequence[int],
                    rows_split: bool) -> tuple[PartitionSpec, PartitionSpec]:
  """``jax.shard_map`` specs (queries, keys and values) of a fused
  attention kernel run per shard: batch over ('data', 'fsdp'), heads over
  'tensor', the queries' positions over 'sequence' where rows_split (the
  keys and values then whole on every shard). Where 'tensor' would split
  query and key heads unevenly, heads stay whole so groups do too."""
  heads = ('tensor',)
  q_spec = _manual_spec(mesh, q_shape, (BATCH_AXES,
                                       ('sequence',) if rows_split else (),
                                       heads, ()))
  kv_spec = _manual_spec(mesh, kv_shape, (BATCH_AXES, (), heads, ()))
  if q_spec[2] != kv_spec[2]:
    q_spec = PartitionSpec(q_spec[0], q_spec[1], None, None)
    kv_spec = PartitionSpec(kv_spec[0], None, None, None)
  return q_spec, kv_spec


def token_rows(x: jax.Array) -> jax.Array:
  """x [B, T, ...] -> rows [B * T, ...], each device's tokens one block.

  Row-major flattening would interleave the shards where the mesh splits
  both B and T (a device's [B / d, T / n] tokens are not contiguous in
  [B * T]), and the compiler would gather T whole to flatten them. With T
  split n ways the rows go shard of T first: [n, B, T / n] flattened, a
  layout split over ('sequence', 'data', 'fsdp') without moving a token
  (the 'tokens' rule). Unsplit, it is the plain reshape.
  """
  b, t = x.shape[:2]
  n = splits('length', t)
  if n > 1:
    x = x.reshape(b, n, t // n, *x.shape[2:]).swapaxes(0, 1)
  return x.reshape(b * t, *x.shape[(3 if n > 1 else 2):])


def from_token_rows(rows: jax.Array, b: int, t: int) -> jax.Array:
  """The inverse of :func:`token_rows`: rows [B * T, ...] -> [B, T, ...]."""
  n = splits('length', t)
  if n == 1:
    return rows.reshape(b, t, *rows.shape[1:])
  x = rows.reshape(n, b, t // n, *rows.shape[1:]).swapaxes(0, 1)
  return x.reshape(b, t, *rows.shape[1:])


def param_specs(logical_axes: Mapping[str, Sequence[str]],
                rules: Mapping[str, str | None] = DEFAULT_RULES
                ) -> dict[str, PartitionSpec]:
  return {k: logical_to_spec(v, rules) for k, v in logical_axes.items()}


def check_divisible(shapes: Mapping[str, Sequence[int]],
                    specs: Mapping[str, PartitionSpec], mesh: Mesh) -> None:
  """Refuses, in one sentence, a dimension that its mesh axis doesn't divide."""
  for name, shape in shapes.items():
    for dim, axis in zip(shape, specs[name]):
      if axis is not None and dim % mesh.shape[axis]:
        raise UsageError(
            f'Parameter {name} has a dimension of {dim} that mesh axis '
            f'{axis!r} of size {mesh.shape[axis]} does not divide; change '
            'that mesh axis or the model size.')


def bytes_per_device(shape: Sequence[int], dtype, spec: PartitionSpec,
                     mesh: Mesh) -> int:
  split = math.prod(mesh.shape[a] for a in spec if a is not None)
  return math.prod(shape) * np.dtype(dtype).itemsize // split


def report(abstract_params: Mapping[str, jax.ShapeDtypeStruct],
           logical_axes: Mapping[str, Sequence[str]],
           specs: Mapping[str, PartitionSpec], mesh: Mesh) -> str:
  """A table: parameter, shape, logical axes, PartitionSpec, bytes/device."""
  rows = [('parameter', 'shape', 'logical axes', 'spec', 'bytes/device')]
  total = 0
  for name, x in abstract_params.items():
    size = bytes_per_device(x.shape, x.dtype, specs[name], mesh)
    total += size
    rows.append((name, str(tuple(x.shape)), str(tuple(logical_axes[name])),
                 str(tuple(specs[name])), f'{size:,}'))
  widths = [max(len(r[i]) for r in rows) for i in range(5)]
  lines = ['  '.join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
  lines.append(f'mesh {dict(mesh.shape)}: {total:,} parameter bytes per '
               'device')
  lines.append(activation_layout(mesh))
  return '\n'.join(lines)


def activation_layout(mesh: Mesh) -> str:
  """One line: how the mesh splits the activations [B, T, D]."""
  batch = mesh.shape['data'] * mesh.shape['fsdp']
  positions = mesh.shape.get('sequence', 1)
  where = ('each row whole' if positions == 1 else
           f'each row\'s positions split {positions} ways over sequence, '
           'keys and values gathered for attention')
  return (f'activations [B, T, D]: the batch split {batch} ways over data x '
          f'fsdp, {where}')


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batch dimension split over ('data', 'fsdp'), the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def check_batch(batch_size: int, mesh: Mesh) -> None:
  """Refuses a batch that the data x fsdp shards do not divide ('sequence'
  splits each row, not the batch); where rows are whole, the refusal names
  the sequence axis that would let fewer rows fill the mesh."""
  shards = mesh.shape['data'] * mesh.shape['fsdp']
  if batch_size % shards == 0:
    return
  advice = f'use a multiple of {shards}'
  rows_split = mesh.shape.get('sequence', 1)
  # The fewest splits of each row that leave data x fsdp dividing the batch.
  split = next((n for n in range(2, shards + 1)
                if shards % n == 0 and batch_size % (shards // n) == 0), None)
  if rows_split == 1 and split is not None:
    advice += (f', or split each row over the sequence axis '
               f'(--config.mesh.sequence={split} leaves {shards // split} '
               'data x fsdp shards)')
  raise UsageError(f'Batch size {batch_size} is not divisible by the '
                   f'{shards} data x fsdp shards of the mesh; {advice}.')


def check_length(seq_len: int, mesh: Mesh, name: str = 'seq_len') -> None:
  """Refuses rows of seq_len positions that the 'sequence' axis does not
  split evenly (its shards would otherwise fall back to whole rows)."""
  shards = mesh.shape.get('sequence', 1)
  if seq_len % shards:
    raise UsageError(f'config.{name}={seq_len} is not divisible by '
                     f'--config.mesh.sequence={shards}, which splits every '
                     'row into that many parts; make it a multiple.')


def fsdp_mesh(abstract_params: Mapping[str, jax.ShapeDtypeStruct],
              logical_axes: Mapping[str, Sequence[str]],
              devices: Sequence[jax.Device]) -> Mesh:
  """The first k of ``devices`` on 'fsdp', k the largest divisor of their
  number whose mesh divides every parameter (1 at worst): where a model
  read for inference is placed when no training mesh says otherwise."""
  devices = list(devices)
  shapes = {k: v.shape for k, v in abstract_params.items()}
  specs = param_specs(logical_axes)
  for k in range(len(devices), 0, -1):
    if len(devices) % k:
      continue
    mesh = make_mesh({'data': 1, 'fsdp': k, 'tensor': 1}, devices[:k])
    try:
      check_divisible(shapes, specs, mesh)
    except UsageError:
      continue
    return mesh
  raise AssertionError('unreachable: one device fits any parameters')
