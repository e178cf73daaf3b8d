"""Accelerator targets to compile for from a CPU host, without the hardware.

The TPU compiler ships in ``libtpu`` (``pip install -e '.[aot]'``) and the
GPU compiler in JAX's CUDA plugin (``'.[aot-gpu]'``). Both hand out compile-only devices
for a described topology (``jax.experimental.topologies``): a mesh of them
lowers and compiles real steps, and the compiler's memory and cost figures
answer, but nothing can run (``compile/topology.py`` gives such devices);
the chip rates below (vendor figures) turn the compiler's figures into a
roofline.

Any slice of the known families parses by name (:func:`target`): TPU names
count TensorCores as Google Cloud's do for v4 and v5p (v5p-64 is 32 chips
of 2 cores, one megacore device each, laid out 2x4x4), chips for v5e and
v6e (v5e-16: 4x4); GPU names count GPUs, 8 a host (h100-16: 2 hosts).

A process that compiles for a target starts one way, :func:`start`
(``train.py --aot_target``, ``scripts/compile_at_size.py``, before JAX
starts; ``scripts/plan.py``, whose imports load JAX first). Nothing here
imports JAX.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import sys
import tempfile
from typing import Iterator

from jax_transformer.errors import UsageError
from jax_transformer.runtime import xla_options


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's rates. Its memory and peak FLOP/s are those
  built in for its kind (``train/memory.py``, ``train/perf.py``)."""
  kind: str               # as jax.Device.device_kind reads
  hbm_bytes_per_s: float
  link_bytes_per_s: float  # chip-to-chip (ICI or NVLink), one direction
  # The chip's share of the network between hosts (GPUs) or slices (TPUs,
  # the data-center network), one direction: what a collective crossing
  # hosts or slices moves at.
  network_bytes_per_s: float


GBIT = 1e9 / 8  # bytes per second of 1 Gb/s
# Google Cloud's TPU pages and NVIDIA's datasheets. The network: v5p 50
# Gb/s of DCN a chip and v5e 2 x 100 Gb/s a host of 8 chips (Google
# Cloud's pages); v4 and v6e, for which no per-chip figure is given,
# assumed at v5e's 25 Gb/s a chip; H100 and H200 hosts 8 x 400 Gb/s
# (one 400 Gb/s NIC a GPU, as the DGX and HGX systems are built).
# Overridable: ``compile_at_size.py`` and ``plan.py`` take
# ``--network_gbps`` (Gb/s a chip).
CHIPS = {
    'v4': Chip('TPU v4', 1228e9, 270e9, 25 * GBIT),
    'v5e': Chip('TPU v5 lite', 819e9, 200e9, 25 * GBIT),
    'v5p': Chip('TPU v5', 2765e9, 600e9, 50 * GBIT),
    'v6e': Chip('TPU v6 lite', 1640e9, 400e9, 25 * GBIT),
    'h100': Chip('NVIDIA H100 80GB HBM3', 3350e9, 450e9, 400 * GBIT),
    'h200': Chip('NVIDIA H200', 4800e9, 450e9, 400 * GBIT),
}


def network_rate(t: 'Target', gbps: float | None = None) -> float:
  """Bytes per second a chip of t moves over the network between hosts
  or slices: ``gbps`` (Gb/s a chip) where given, else its chip's default
  (``CHIPS``)."""
  if gbps is not None:
    if gbps <= 0:
      raise UsageError(f'--network_gbps must be above 0, got {gbps}.')
    return gbps * GBIT
  return CHIPS[t.chip].network_bytes_per_s


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

# What to install: a compiler for a target on a CPU host (its extra and
# module); a runtime on the machines that run it.
AOT_EXTRA = {'tpu': ('aot', 'libtpu'), 'cuda': ('aot-gpu', 'jax_cuda12_plugin')}
AOT_INSTALL = {platform: f"pip install -e '.[{extra}]'"
               for platform, (extra, _) in AOT_EXTRA.items()}
RUN_INSTALL = ("pip install -e '.[tpu]' on a TPU VM or '.[cuda]' on GPU "
               'hosts')
_RUNTIMES = ('libtpu', 'jax_cuda12_plugin')
# What the runtimes print of their own start on a host without their
# hardware, held back by start(): the CUDA plugin's libraries say, once
# each as JAX imports them and registers the plugin, that there is no CUDA
# driver, after absl's note on logging before its start. (libtpu's lines
# are answered at their source: start() names the slice and its host.)
_START_LINES = ('Could not find cuda drivers on your machine',
                'All log messages before absl::InitializeLog() is called')


def accelerator_runtimes() -> list[str]:
  """The TPU and GPU runtimes installed (module names), found or not."""
  return [m for m in _RUNTIMES if importlib.util.find_spec(m) is not None]


@contextlib.contextmanager
def start(name: str | None = None, host_devices: int | None = None,
          overlap: bool | None = None) -> Iterator[Target | None]:
  """The one start-up of a process that compiles for a target on this
  host, before anything starts JAX; its body imports what compiles
  (and with it JAX)::

      with targets.start('h100-16'):
        from jax_transformer.compile import report

  Gives the Target called name (None without one). A name that is not a
  slice, or a target whose compiler is not installed, is a UsageError in
  one sentence (naming the extra to install), before anything else. Then
  the environment the compilers read as they start: JAX itself runs on
  this host's CPU (``host_devices`` of them, for meshes of CPU devices),
  libtpu looks for no TPU VM's metadata and is told the slice it compiles
  for (its accelerator type, this host its one worker), and the target's
  collective-overlap options (``xla_options.apply``, unless ``overlap`` is
  False); settings the environment has are kept. Last, JAX's plugins
  (the GPU compiler among them) register. What the runtimes print of
  their own start meanwhile (``_START_LINES``) is held back; anything else
  written to stderr is kept.
  """
  t = None
  if name is not None:
    t = target(name)
    require_compiler(t)
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  if t is not None and t.platform == 'tpu':
    os.environ.setdefault('TPU_ACCELERATOR_TYPE', t.name)
    os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
  if host_devices and 'xla_force_host_platform_device_count' not in (
      os.environ.get('XLA_FLAGS', '')):
    os.environ['XLA_FLAGS'] = (
        f"{os.environ.get('XLA_FLAGS', '')} "
        f'--xla_force_host_platform_device_count={host_devices}').strip()
  if t is not None:
    xla_options.apply([t.kernel_platform], on=overlap)
  with _without_start_lines():
    yield t
    _register_plugins(os.environ['JAX_PLATFORMS'])


def _register_plugins(platforms: str) -> None:
  """JAX's plugins registered on ``platforms``, as set (also where JAX was
  imported before they were, while no backend has started); nothing where
  JAX is not imported yet (it starts later, as set). No compiler starts
  here: each reads its options as a topology is described."""
  jax, bridge = sys.modules.get('jax'), sys.modules.get('jax._src.xla_bridge')
  if jax is None or bridge is None:
    return
  if (platforms and jax.config.jax_platforms != platforms
      and not getattr(bridge, '_backends', None)):
    jax.config.update('jax_platforms', platforms)
  register = getattr(bridge, '_discover_and_register_pjrt_plugins', None)
  if register is not None:
    register()


@contextlib.contextmanager
def _without_start_lines() -> Iterator[None]:
  """Holds back what is written to stderr's file descriptor (where the
  runtimes' C++ logs go) while it runs, then writes it out less the lines
  of _START_LINES, also when it raises."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      held.seek(0)
      lines = held.read().decode(errors='replace').splitlines(keepends=True)
      kept = ''.join(line for line in lines
                     if not any(said in line for said in _START_LINES))
      if kept:
        sys.stderr.write(kept)
        sys.stderr.flush()


def check_slices(t: Target, slices: int) -> None:
  """UsageError in one sentence for a number of slices t cannot be."""
  if slices < 1:
    raise UsageError(f'--slices must be 1 or more, got {slices}.')
  if slices > 1 and t.platform != 'tpu':
    raise UsageError(f'--slices {slices}: several slices are a TPU layout; '
                     f'{t.name} is a GPU target.')


def require_compiler(t: Target) -> None:
  """UsageError in one sentence, naming the extra, when the target's
  compiler is absent."""
  extra, module = AOT_EXTRA[t.platform]
  if importlib.util.find_spec(module) is None:
    where = (', or into a folder on PYTHONPATH (docs/scaling.md)'
             if t.platform == 'cuda' else '')
    raise UsageError(f'Target {t.name} needs the {t.kernel_platform.upper()} '
                     f'compiler ({module}, the {extra} extra), which is not '
                     f'installed here: {AOT_INSTALL[t.platform]}{where}.')


def kernel_platform(platform: str) -> str:
  """A JAX device platform ('cuda', 'rocm', 'tpu', 'cpu') as the attention
  kernels and the planner name it ('gpu', 'tpu', 'cpu')."""
  return 'gpu' if platform in ('cuda', 'rocm', 'gpu') else platform
