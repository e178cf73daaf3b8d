"""The compiler options that ask XLA to overlap collectives with compute,
per platform, in one place.

TPU options go to libtpu through ``LIBTPU_INIT_ARGS``, GPU options to XLA
through ``XLA_FLAGS``; both are read once, when JAX starts the backend
(for a compile-only target: when the first topology is described), so
``apply`` runs before that: at ``train.py``'s start-up and before a
compile for a target (``compile_at_size.py``, ``train.py --aot_target``,
``plan.py``, ``target_table.py``'s processes). Each option was checked
against the compilers of this project's jax (0.10.2: libtpu 0.0.42 and
jax-cuda12-plugin 0.10.2), which abort on a name they do not know: GPU
XLA has no ``--xla_gpu_enable_async_collectives`` or
``--xla_gpu_enable_async_all_gather`` any more (collectives are
asynchronous by default there).

On by default; ``JAX_TRANSFORMER_XLA_OVERLAP=0`` (or ``train.py
--noxla_overlap``, ``compile_at_size.py --noxla_overlap``) turns them off.
An option the environment already names keeps the environment's value.
Nothing here imports JAX.
"""

from __future__ import annotations

import os
import shlex
import sys

ENV_SWITCH = 'JAX_TRANSFORMER_XLA_OVERLAP'

# (option, short name for the start line and the table). As MaxText sets
# them for dense models (benchmarks/xla_flags_library.py: continuation
# fusion for all-gather and all-reduce, data-parallel all-reduce overlap).
TPU = (
    ('--xla_tpu_enable_latency_hiding_scheduler=true', 'lhs'),
    ('--xla_tpu_enable_async_collective_fusion=true', 'async-fusion'),
    ('--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true', 'ag'),
    ('--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=true', 'ar'),
    ('--xla_tpu_enable_async_collective_fusion_multiple_steps=true',
     'multi-step'),
    ('--xla_tpu_overlap_compute_collective_tc=true', 'overlap-tc'),
    ('--xla_enable_async_all_gather=true', 'async-ag'),
    ('--xla_enable_async_all_reduce=true', 'async-ar'),
    ('--xla_enable_async_collective_permute=true', 'async-cp'),
    ('--xla_tpu_enable_data_parallel_all_reduce_opt=true', 'dp-ar'),
    ('--xla_tpu_data_parallel_opt_different_sized_ops=true', 'dp-sizes'),
)
GPU = (
    ('--xla_gpu_enable_latency_hiding_scheduler=true', 'lhs'),
    ('--xla_gpu_enable_highest_priority_async_stream=true', 'priority-stream'),
    ('--xla_gpu_enable_pipelined_all_gather=true', 'pipelined-ag'),
    ('--xla_gpu_enable_pipelined_reduce_scatter=true', 'pipelined-rs'),
    ('--xla_gpu_enable_pipelined_all_reduce=true', 'pipelined-ar'),
)
OPTIONS = {'tpu': TPU, 'gpu': GPU}
_VARIABLE = {'tpu': 'LIBTPU_INIT_ARGS', 'gpu': 'XLA_FLAGS'}


def platform_of(name: str) -> str | None:
  """'tpu' or 'gpu' for a JAX platform or device name, else None."""
  name = name.lower()
  if name == 'tpu' or name.startswith('tpu'):
    return 'tpu'
  if name in ('gpu', 'cuda', 'rocm'):
    return 'gpu'
  return None


def enabled() -> bool:
  """Whether the overlap options are wanted (``ENV_SWITCH`` not 0)."""
  return os.environ.get(ENV_SWITCH, '1').strip().lower() not in (
      '0', 'false', 'no', 'off')


def _name(option: str) -> str:
  return option.split('=', 1)[0]


def apply(platforms=('tpu', 'gpu'), on: bool | None = None) -> list[str]:
  """Adds the platforms' options to the variables their compilers read,
  unless turned off (``on`` False, or ``ENV_SWITCH``=0: then ``ENV_SWITCH``
  is set to 0 so that child processes agree). Options the variable
  already names are left as given. Returns the options added."""
  if on is None:
    on = enabled()
  if not on:
    os.environ[ENV_SWITCH] = '0'
    return []
  added = []
  for platform in platforms:
    variable = _VARIABLE[platform]
    given = shlex.split(os.environ.get(variable, ''))
    named = {_name(o) for o in given}
    new = [o for o, _ in OPTIONS[platform] if _name(o) not in named]
    if new:
      os.environ[variable] = ' '.join(given + new)
      added += new
      if platform == 'gpu' and _backend_started():
        # XLA reads XLA_FLAGS once, as the first backend starts.
        print('xla_options: JAX has started a backend already; the GPU '
              'compiler keeps the options it started with.',
              file=sys.stderr)
  return added


def _backend_started() -> bool:
  """Whether this process's JAX has started a GPU backend, which read
  XLA_FLAGS as it started (read without importing JAX). A started CPU
  backend does not matter: the GPU options are for a GPU's compiler."""
  bridge = sys.modules.get('jax._src.xla_bridge')
  started = getattr(bridge, '_backends', None) or {}
  return any(name in ('cuda', 'rocm', 'gpu') for name in started)


def in_force(platform: str) -> list[tuple[str, str]]:
  """(option as the environment gives it, short name) of each of our
  options for platform that the environment names now."""
  platform = platform_of(platform) or platform
  if platform not in OPTIONS:
    return []
  given = {_name(o): o for o in shlex.split(
      os.environ.get(_VARIABLE[platform], ''))}
  return [(given[_name(o)], short) for o, short in OPTIONS[platform]
          if _name(o) in given]


def describe(platform: str) -> str:
  """The options in force for platform in short form, e.g. 'XLA overlap:
  lhs, async-fusion, ... (LIBTPU_INIT_ARGS)'; 'XLA overlap: off' when
  none, 'XLA overlap: none for cpu' on a platform without any."""
  kind = platform_of(platform)
  if kind is None:
    return f'XLA overlap: none for {platform}'
  on = in_force(kind)
  if not on:
    return 'XLA overlap: off'
  names = [short if option.endswith('=true') else
           f'{short}={option.split("=", 1)[-1]}' for option, short in on]
  return f'XLA overlap: {", ".join(names)} ({_VARIABLE[kind]})'
