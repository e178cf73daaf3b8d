"""Accelerator targets to compile for from a CPU host, without the hardware.

The TPU compiler ships in ``libtpu`` and the GPU compiler in JAX's CUDA
plugin (``pip install -e '.[aot]'``). Both hand out compile-only devices
for a described topology (``jax.experimental.topologies``): a mesh of them
lowers and compiles real steps, and the compiler's memory and cost figures
answer, but nothing can run. ``devices('v5p-128')`` gives such devices;
the chip rates below (vendor figures) turn the compiler's figures into a
roofline.

TPU names count TensorCores as Google Cloud's do before v5e (v4-8 and
v5p-8 are 4 chips of 2 cores, one megacore device each); from v5e on, one
per chip.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

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


TARGETS = {t.name: t for t in (
    Target('v4-8', 'v4', 'v4:2x2x1', megacore=True),
    Target('v5e-4', 'v5e', 'v5e:2x2'),
    Target('v5e-8', 'v5e', 'v5e:2x4'),
    Target('v5e-256', 'v5e', 'v5e:16x16'),
    Target('v5p-8', 'v5p', 'v5:2x2x1', megacore=True),
    Target('v5p-128', 'v5p', 'v5:4x4x4', megacore=True),
    Target('v5p-1024', 'v5p', 'v5:8x8x8', megacore=True),
    Target('v6e-8', 'v6e', 'v6e:2x4'),
    Target('v6e-256', 'v6e', 'v6e:16x16'),
    Target('h100-8', 'h100', '1x1x8'),
    Target('h100-64', 'h100', '8x1x8'),  # 8 hosts of 8
    Target('h200-8', 'h200', '1x1x8'),
    Target('h200-64', 'h200', '8x1x8'),
)}

AOT_INSTALL = "pip install -e '.[aot]'"


def target(name: str) -> Target:
  """The Target called name; UsageError naming the known ones."""
  if name not in TARGETS:
    raise UsageError(f'Unknown target {name!r}; choose one of '
                     f'{", ".join(TARGETS)}.')
  return TARGETS[name]


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
    topo = topologies.get_topology_desc(
        platform='tpu', topology_name=t.topology,
        chips_per_host_bounds=(2, 2, 1), num_slices=slices, **extra)
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
                     f'{AOT_INSTALL}.')


def kernel_platform(platform: str) -> str:
  """A JAX device platform ('cuda', 'rocm', 'tpu', 'cpu') as the attention
  kernels and the planner name it ('gpu', 'tpu', 'cpu')."""
  return 'gpu' if platform in ('cuda', 'rocm', 'gpu') else platform
