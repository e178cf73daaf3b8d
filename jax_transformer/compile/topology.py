"""A target's compile-only devices, as its compiler describes them
(``jax.experimental.topologies``): a mesh of them lowers and compiles real
steps, and nothing can run. The target and its compiler's start-up:
``runtime/targets.py``."""

from __future__ import annotations

from jax.experimental import topologies

from jax_transformer.runtime import gpu_specs, targets


def devices(t: targets.Target, slices: int = 1) -> list:
  """Compile-only devices of ``slices`` copies of target t (TPU only for
  more than one), in the order a mesh takes them."""
  targets.check_slices(t, slices)
  targets.require_compiler(t)
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
