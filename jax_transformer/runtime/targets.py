"""Accelerator targets to compile for from a CPU host, without the hardware.

The TPU compiler ships in ``libtpu`` (``pip install -e '.[aot]'``) and the
GPU compiler in JAX's CUDA plugin (``'.[aot-gpu]'``). Both hand out compile-only devices
for a described topology (``jax.experimental.topologies``): a mesh of them
lowers and compiles real steps, and the compiler's memory and cost figures
answer, but nothing can run. ``devices('v5p-128')`` gives such devices;
the chip rates below (vendor figures) turn the compiler's figures into a
roofline.

Any slice of the known families parses by name (:func:`target`): TPU names
count TensorCores as Google Cloud's do for v4 and v5p (v5p-64 is 32 chips
of 2 cores, one megacore device each, laid out 2x4x4), chips for v5e and
v6e (v5e-16: 4x4); GPU names count GPUs, 8 a host (h100-16: 2 hosts).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

from jax.experimental import topologies

from jax_transformer.errors import UsageError
from jax_transformer.runtime import gpu_specs


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's rates. Its memory and peak FLOP/s are those
  built in for its kind (``train/memory.py``, ``train/perf.py``)."""
  kind: str               # as jax.Device.device_kind reads
  hbm_bytes_per_s: float
  link_bytes_per_s: float  # chip-to-chip (ICI or NVLink), one direction


# Google Cloud's TPU pages and NVIDIA's datasheets.
CHIPS = {
    'v4': Chip('TPU v4', 1228e9, 270e9),
    'v5e': Chip('TPU v5 lite', 819e9, 200e9),
    'v5p': Chip('TPU v5', 2765e9, 600e9),
    'v6e': Chip('TPU v6 lite', 1640e9, 400e9),
    'h100': Chip('NVIDIA H100 80GB HBM3', 3350e9, 450e9),
    'h200': Chip('NVIDIA H200', 4800e9, 450e9),
}


@dataclasses.dataclass(frozen=True)
class Target:
  """A slice (TPU) or a host (GPU) by its usual name."""
  name: str
  chip: str               # a key of CHIPS
  topology: str           # TPU: 'v5e:2x2'; GPU: hosts x 1 x GPUs per host
  megacore: bool = False  # two TensorCores as one device (v4, v5p)

  @property
  def platform(self) -> str:
    """The compiler's platform name: 'cuda' or 'tpu'."""
    return 'cuda' if self.chip.startswith('h') else 'tpu'

  @property
  def kernel_platform(self) -> str:
    """The platform as attention kernels name it: 'gpu' or 'tpu'."""
    return kernel_platform(self.platform)

  @property
  def chips(self) -> int:
    dims = self.topology.split(':')[-1].split('x')
    n = 1
    for d in dims:
      n *= int(d)
    return n


@dataclasses.dataclass(frozen=True)
class _Family:
  """A TPU generation as Google Cloud names its slices."""
  prefix: str              # of the topology name get_topology_desc takes
  cores_per_chip: int      # what N of 'v5p-N' counts: 2 TensorCores a chip
  pod: tuple[int, ...]     # the largest slice, chips per dimension


_TPU = {
    'v4': _Family('v4', 2, (16, 16, 16)),
    'v5p': _Family('v5', 2, (16, 20, 28)),
    'v5e': _Family('v5e', 1, (16, 16)),
    'v6e': _Family('v6e', 1, (16, 16)),
}
# v5e and v6e: the 2D slices Google Cloud offers, by chips.
_SLICES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8),
              64: (8, 8), 128: (8, 16), 256: (16, 16)}
# v4 and v5p: the 3D slices below one 4x4x4 cube, by chips; larger ones
# are whole cubes (_cubes).
_SLICES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4)}
GPUS_PER_HOST = 8
_NAME = re.compile(r'([a-z]\w*?)-(\d+)')
NAMING = ('name a TPU slice v4-N or v5p-N (N TensorCores, 2 a chip), v5e-N or '
          'v6e-N (N chips), e.g. v5e-4, v5p-64, v6e-256, or GPU hosts '
          'h100-N or h200-N (N GPUs, 8 a host), e.g. h100-16')


def target(name: str) -> Target:
  """The Target called name (e.g. 'v5p-64', 'v5e-16', 'h100-16'), its
  topology derived as Google Cloud lays out that slice; UsageError in one
  sentence for a name or a size that is not one."""
  match = _NAME.fullmatch(name or '')
  if not match or match.group(1) not in (*_TPU, 'h100', 'h200'):
    raise UsageError(f'Unknown target {name!r}: {NAMING}.')
  chip, n = match.group(1), int(match.group(2))
  if chip in ('h100', 'h200'):
    if n < GPUS_PER_HOST or n % GPUS_PER_HOST:
      raise UsageError(f'{name} is not a number of whole GPU hosts: {chip}-N '
                       f'counts GPUs, {GPUS_PER_HOST} a host (e.g. {chip}-8, '
                       f'{chip}-16, {chip}-64).')
    return Target(name, chip, f'{n // GPUS_PER_HOST}x1x{GPUS_PER_HOST}')
  family = _TPU[chip]
  dims = _tpu_dims(family, n)
  if dims is None:
    raise UsageError(f'{name} is not a {chip} slice: {_sizes(chip)}.')
  return Target(name, chip, f'{family.prefix}:{"x".join(map(str, dims))}',
                megacore=family.cores_per_chip == 2)


def _tpu_dims(family: _Family, n: int) -> tuple[int, ...] | None:
  """Chips per dimension of the slice of n (cores or chips), or None."""
  if n < 1 or n % family.cores_per_chip:
    return None
  chips = n // family.cores_per_chip
  if len(family.pod) == 2:
    return _SLICES_2D.get(chips)
  if chips in _SLICES_3D:
    return _SLICES_3D[chips]
  if chips % 64:
    return None
  dims = _cubes(chips // 64)
  if any(d > p for d, p in zip(dims, sorted(family.pod))):
    return None
  return dims


def _cubes(units: int) -> tuple[int, int, int]:
  """units 4x4x4 cubes as the most cubic a x b x c (a <= b <= c) of
  multiples of 4: 2 -> 4x4x8, 3 -> 4x4x12, 4 -> 4x8x8, 6 -> 4x8x12."""
  best = (1, 1, units)
  for a in range(1, units + 1):
    for b in range(a, units // a + 1):
      c, rest = divmod(units, a * b)
      if not rest and c >= b and (c, b) < (best[2], best[1]):
        best = (a, b, c)
  return tuple(4 * d for d in best)


def _sizes(chip: str) -> str:
  """The slice sizes of a TPU family, in words."""
  family = _TPU[chip]
  if len(family.pod) == 2:
    sizes = ', '.join(map(str, _SLICES_2D))
    return f'{chip}-N counts chips, one of {sizes} (e.g. {chip}-16)'
  pod = 'x'.join(map(str, family.pod))
  return (f'{chip}-N counts TensorCores (2 a chip): 8, 16, 32, 64, or a '
          f'multiple of 128 that fits the {pod} pod as whole 4x4x4 cubes '
          f'(e.g. {chip}-64, {chip}-128, {chip}-384)')


# Examples the docs and tables name; any name target() takes works.
TARGETS = {name: target(name) for name in (
    'v4-8', 'v5e-4', 'v5e-8', 'v5e-256', 'v5p-8', 'v5p-64', 'v5p-128',
    'v5p-1024', 'v6e-8', 'v6e-256', 'h100-8', 'h100-16', 'h100-64', 'h200-8',
    'h200-64')}

# What to install: a compiler for a target on a CPU host; a runtime on the
# machines that run it.
AOT_INSTALL = {'tpu': "pip install -e '.[aot]'",
               'cuda': "pip install -e '.[aot-gpu]'"}
RUN_INSTALL = ("pip install -e '.[tpu]' on a TPU VM or '.[cuda]' on GPU "
               'hosts')
_RUNTIMES = ('libtpu', 'jax_cuda12_plugin')


def accelerator_runtimes() -> list[str]:
  """The TPU and GPU runtimes installed (module names), found or not."""
  return [m for m in _RUNTIMES if importlib.util.find_spec(m) is not None]


def prepare_host() -> None:
  """Environment the accelerator plugins read when JAX starts: call it
  before JAX's first use. The host is a CPU machine, not a TPU VM: skip
  libtpu's metadata queries, and run JAX itself on the CPU."""
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')


def devices(t: Target, slices: int = 1) -> list:
  """Compile-only devices of ``slices`` copies of target t (TPU only for
  more than one), in the order a mesh takes them."""
  if slices < 1:
    raise UsageError(f'--slices must be 1 or more, got {slices}.')
  if slices > 1 and t.platform != 'tpu':
    raise UsageError(f'--slices {slices}: several slices are a TPU layout; '
                     f'{t.name} is a GPU target.')
  _require(t)
  if t.platform == 'tpu':
    extra = {'chip_config_name': 'megacore'} if t.megacore else {}
    # Four chips a host (one for a one-chip slice), as TPU VMs have them.
    bounds = (2, 2, 1) if t.chips >= 4 else (1, 1, 1)
    topo = topologies.get_topology_desc(
        platform='tpu', topology_name=t.topology,
        chips_per_host_bounds=bounds, num_slices=slices, **extra)
  else:
    topo = topologies.get_topology_desc(
        platform='cuda', topology=t.topology,
        target_config=gpu_specs.target_config(t.chip))
  # Slice by slice: a mesh's first axis split over slices crosses the
  # data-center network only between them (make_mesh keeps this order).
  return sorted(topo.devices, key=_device_order)


def _device_order(device) -> tuple[int, int]:
  return getattr(device, 'slice_index', 0) or 0, device.id


def _require(t: Target) -> None:
  """UsageError in one sentence when the target's compiler is absent."""
  module = 'libtpu' if t.platform == 'tpu' else 'jax_cuda12_plugin'
  if importlib.util.find_spec(module) is None:
    raise UsageError(f'Target {t.name} needs the {t.platform.upper()} '
                     f'compiler ({module}), which is not installed; run '
                     f'{AOT_INSTALL[t.platform]}.')


def kernel_platform(platform: str) -> str:
  """A JAX device platform ('cuda', 'rocm', 'tpu', 'cpu') as the attention
  kernels and the planner name it ('gpu', 'tpu', 'cpu')."""
  return 'gpu' if platform in ('cuda', 'rocm', 'gpu') else platform
