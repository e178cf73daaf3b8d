"""The devices this process found, against what a run asks of them."""

from __future__ import annotations

import jax

from jax_transformer.errors import UsageError
from jax_transformer.runtime import targets


def check_accelerators(mesh_sizes: dict[str, int],
                       devices: list | None = None) -> None:
  """Refuses, naming the extra to install, a mesh (config.mesh's sizes)
  that asks for more devices than there are where JAX found only CPUs (an
  install without a TPU or GPU runtime, or one run where there is no
  accelerator)."""
  devices = jax.devices() if devices is None else devices
  asked = 1
  for axis in ('data', 'fsdp', 'sequence', 'tensor'):
    size = mesh_sizes.get(axis, 1)
    if isinstance(size, int) and size > 0:
      asked *= size
  if asked <= len(devices) or any(d.platform != 'cpu' for d in devices):
    return
  found = f'{len(devices)} CPU device{"s" if len(devices) > 1 else ""}'
  runtimes = targets.accelerator_runtimes()
  if runtimes:
    raise UsageError(
        f'config.mesh asks for {asked} devices but JAX found {found} and no '
        f'accelerator here, although {" and ".join(runtimes)} '
        f'{"is" if len(runtimes) == 1 else "are"} installed (no TPU or GPU '
        'on this machine, or JAX_PLATFORMS=cpu): run it on the TPU VM or GPU '
        f'hosts, installed there with {targets.RUN_INSTALL}.')
  raise UsageError(
      f'config.mesh asks for {asked} devices but this install has {found} '
      f'and no TPU or GPU runtime: {targets.RUN_INSTALL}.')
