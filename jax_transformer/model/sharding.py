"""Device mesh, logical-axis rules and the pre-flight sharding report.

Model code names logical axes ('embed', 'mlp', 'heads', ...); one rules table
maps them to the mesh axes ('data', 'fsdp', 'tensor'). Batches are split over
('data', 'fsdp'); parameters are split over 'fsdp' (ZeRO-3 style) and
'tensor' (Megatron style). Activations are pinned by the same table
(:func:`constrain`): the batch over ('data', 'fsdp'), heads, MLP features
and the vocabulary over 'tensor'; 'embed' stays whole in an activation
because its batch already took 'fsdp'.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_transformer.errors import UsageError

MESH_AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')

# Logical axis -> mesh axis or axes (None: replicated).
DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    'batch': BATCH_AXES,
    'length': None,
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


def make_mesh(sizes: Mapping[str, int],
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh over all (or the given) devices."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(sizes, len(devices))
  if devices == list(jax.devices()):
    return jax.make_mesh(shape, MESH_AXES,
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


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


def constrain(x: jax.Array, axes: Sequence[str],
              rules: Mapping[str, str | tuple[str, ...] | None]
              = DEFAULT_RULES) -> jax.Array:
  """x laid out by its logical axes (one name per dimension), when traced
  under a mesh (``jax.set_mesh`` or ``jax.sharding.use_abstract_mesh``);
  unchanged otherwise.

  Without this the compiler propagates layouts from the parameters and may
  pick one that gathers a whole batch or all heads on every device. Mesh
  axes the current mesh lacks, or that do not divide their dimension, are
  dropped (the dimension is then replicated over them).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = []
  for dim, entry in zip(x.shape, logical_to_spec(axes, rules)):
    names = (entry,) if isinstance(entry, str) else tuple(entry or ())
    names = tuple(a for a in names if a in mesh.axis_names)
    if names and dim % math.prod(mesh.shape[a] for a in names):
      names = ()
    spec.append(names[0] if len(names) == 1 else (names or None))
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


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
  return '\n'.join(lines)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batch dimension split over ('data', 'fsdp'), the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def check_batch(batch_size: int, mesh: Mesh) -> None:
  shards = mesh.shape['data'] * mesh.shape['fsdp']
  if batch_size % shards:
    raise UsageError(f'Batch size {batch_size} is not divisible by the '
                     f'{shards} data x fsdp shards of the mesh; use a '
                     f'multiple of {shards}.')
