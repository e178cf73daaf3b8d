"""The mesh over several TPU slices (or GPU hosts): each slice holds the
same block, and only 'data' and 'fsdp' cross between slices, in the outer
part of each (``sharding.make_mesh``); the compile for a target builds the
same mesh through the same function.

Slices here are stand-in devices that carry ``slice_index`` (or
``process_index``), and the TPU compiler's own compile-only devices of two
slices where libtpu is installed.
"""

import importlib.util

import jax
import numpy as np
import pytest

from jax_transformer import cli
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.model import sharding


class FakeDevice:
  """What make_mesh reads of a device."""

  def __init__(self, id_, slice_index=0, process_index=0, platform='cpu'):
    self.id, self.slice_index = id_, slice_index
    self.process_index, self.platform = process_index, platform
    self.device_kind = 'stand-in'

  def __repr__(self):
    return f'D{self.id}@{self.slice_index}'


def slices(n, per_slice):
  """n slices of per_slice devices, listed out of order."""
  devices = [FakeDevice(s * per_slice + i, slice_index=s)
             for s in range(n) for i in range(per_slice)]
  return devices[::-1]


def crossing(mesh):
  """Per axis: how many slices a line along it meets, from the devices."""
  owner = np.vectorize(lambda d: d.slice_index, otypes=[int])(mesh.devices)
  out = {}
  for i, axis in enumerate(mesh.axis_names):
    lines = np.moveaxis(owner, i, -1).reshape(-1, owner.shape[i])
    out[axis] = max(len(set(line)) for line in lines)
  return out


@pytest.mark.parametrize('sizes, crosses', [
    ({'data': 2, 'fsdp': 4}, {'data': 2, 'fsdp': 1, 'sequence': 1, 'tensor': 1}),
    ({'data': -1}, {'data': 2, 'fsdp': 1, 'sequence': 1, 'tensor': 1}),
    ({'data': 4, 'fsdp': 2}, {'data': 2, 'fsdp': 1, 'sequence': 1, 'tensor': 1}),
    # data=1: fsdp crosses instead (as lm_7b's fsdp=-1 over two slices).
    ({'data': 1, 'fsdp': -1}, {'data': 1, 'fsdp': 2, 'sequence': 1, 'tensor': 1}),
    ({'data': 1, 'fsdp': 4, 'tensor': 2},
     {'data': 1, 'fsdp': 2, 'sequence': 1, 'tensor': 1}),
    # Asked for: fsdp across although data could be.
    ({'data': 2, 'fsdp': 4, 'dcn_fsdp': 2},
     {'data': 1, 'fsdp': 2, 'sequence': 1, 'tensor': 1}),
    # 'sequence', like 'tensor', stays inside a slice.
    ({'data': 2, 'fsdp': 2, 'sequence': 2},
     {'data': 2, 'fsdp': 1, 'sequence': 1, 'tensor': 1}),
])
def test_only_the_outer_part_of_data_or_fsdp_crosses_two_slices(sizes,
                                                                 crosses):
  mesh = sharding.make_mesh(sizes, slices(2, 4))
  assert crossing(mesh) == crosses
  assert sharding.spans(mesh) == crosses
  # Slice by slice: the first half of the crossing axis is slice 0.
  axis = next(a for a, n in crosses.items() if n > 1)
  owner = np.vectorize(lambda d: d.slice_index)(mesh.devices)
  first = np.take(owner, range(mesh.shape[axis] // 2),
                  axis=mesh.axis_names.index(axis))
  assert (first == 0).all()
  assert mesh.axis_types == (jax.sharding.AxisType.Auto,) * 4


def test_four_slices_take_data_first_then_fsdp():
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 4}, slices(4, 2))
  assert crossing(mesh) == {'data': 2, 'fsdp': 2, 'sequence': 1,
                            'tensor': 1}
  # Each slice holds one 1 x 2 x 1 block: its two devices share a data row.
  owner = np.vectorize(lambda d: d.slice_index)(mesh.devices)
  for s in range(4):
    assert len(set(np.argwhere(owner == s)[:, 0])) == 1


@pytest.mark.parametrize('sizes, message', [
    ({'data': 1, 'fsdp': 1, 'tensor': 8},
     "Mesh {'data': 1, 'fsdp': 1, 'sequence': 1, 'tensor': 8} cannot be "
     'split over the 2 '
     'slices with only data and fsdp crossing between them: make '
     'config.mesh.data x config.mesh.fsdp (1 x 1) a multiple of 2'),
    ({'data': 1, 'fsdp': 8, 'dcn_data': 2},
     'config.mesh.dcn_data=2 and dcn_fsdp=0 do not fit mesh'),
    ({'data': 2, 'fsdp': 4, 'dcn_data': 2, 'dcn_fsdp': 2},
     'their product must be 2'),
    ({'data': 8, 'dcn_fsdp': True}, 'config.mesh.dcn_fsdp must be an integer'),
    ({'data': 8, 'dcn_data': 'data'}, 'config.mesh.dcn_data must be an '
     "integer >= 0 (how many slices or hosts that axis spans; 0 for both: "
     "automatic), got 'data'."),
])
def test_a_mesh_that_cannot_span_the_slices_is_refused_in_one_sentence(
    sizes, message):
  with pytest.raises(UsageError) as err:
    sharding.make_mesh(sizes, slices(2, 4))
  assert message in str(err.value), err.value
  assert '\n' not in str(err.value)


def test_gpu_hosts_are_processes_that_hold_several_gpus():
  hosts = [FakeDevice(i, process_index=i // 4, platform='gpu')
           for i in range(8)]
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 4}, hosts)
  owner = np.vectorize(lambda d: d.process_index)(mesh.devices)
  assert (owner[0] == 0).all() and (owner[1] == 1).all()
  with pytest.raises(UsageError, match='over the 2 hosts'):
    sharding.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 8}, hosts)
  # One GPU a process says nothing of hosts: XLA's numbering is kept.
  alone = [FakeDevice(i, process_index=i, platform='gpu') for i in range(8)]
  mesh = sharding.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 8}, alone)
  assert [d.id for d in mesh.devices.flat] == list(range(8))


def test_one_slice_keeps_the_plain_mesh():
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})
  assert list(mesh.devices.flat) == jax.devices()
  assert sharding.spans(mesh) == {'data': 1, 'fsdp': 1, 'sequence': 1,
                                  'tensor': 1}


needs_tpu = pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None,
    reason="no TPU compiler: pip install -e '.[aot]'")


@needs_tpu
def test_two_tpu_slices_and_their_compile_build_one_mesh(monkeypatch):
  """The TPU compiler's compile-only devices of two v5e-4 slices: the
  mesh crosses them on data only, and the train step lowered for that
  target (what ``--aot_target`` compiles) is lowered on that very mesh."""
  monkeypatch.setenv('TPU_SKIP_MDS_QUERY', '1')
  monkeypatch.setenv('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  from jax_transformer.compile import lowering, topology  # pylint: disable=g-import-not-at-top
  from jax_transformer.runtime import targets  # pylint: disable=g-import-not-at-top
  devices = topology.devices(targets.target('v5e-4'), slices=2)
  assert {d.slice_index for d in devices} == {0, 1}
  cfg = cli.load_config('lm_shakespeare:tiny')
  cfg.mesh.update(data=2, fsdp=4)
  cfg.batch_size = 16
  mesh = sharding.make_mesh(cfg.mesh, devices)
  assert sharding.spans(mesh) == {'data': 2, 'fsdp': 1, 'sequence': 1,
                                  'tensor': 1}
  # Within a slice, fsdp runs over the 2x2 chips' torus, as on the slice.
  assert {tuple(d.coords) for d in mesh.devices[0].flat} == {
      (0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)}
  run = lowering.lower_train(Experiment.of(cfg), devices, 'tpu')
  assert (run.mesh.devices == mesh.devices).all()
  assert run.mesh.axis_names == mesh.axis_names
