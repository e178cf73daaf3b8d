"""restore.inference_mesh: the mesh a trained model is restored onto to be
scored, decoded or exported, over this host's devices."""

import types

import jax

from jax_transformer.experiment import Experiment
from jax_transformer.workdirs import restore


def workdir(mesh, shapes):
  """A stand-in Workdir: config.mesh and parameters {name: (shape, axes)}."""
  setup = types.SimpleNamespace(
      abstract_params={k: jax.ShapeDtypeStruct(s, 'float32')
                       for k, (s, _) in shapes.items()},
      model_def=types.SimpleNamespace(
          logical_axes={k: a for k, (_, a) in shapes.items()}))
  cfg = Experiment.of({'mesh': mesh})
  return types.SimpleNamespace(config=cfg, setup=setup)


PARAMS = {'embed': ((256, 64), ('vocab', 'embed')),
          'wi': ((64, 128), ('embed', 'mlp'))}


def sizes(mesh):
  return dict(mesh.shape)


def test_the_training_mesh_when_it_fits_this_host():
  assert len(jax.local_devices()) == 8
  for trained_on, want in (
      ({'data': -1, 'fsdp': 1, 'tensor': 1}, (8, 1, 1, 1)),
      ({'data': 1, 'fsdp': -1, 'tensor': 1}, (1, 8, 1, 1)),
      ({'data': 1, 'fsdp': 4, 'tensor': 2}, (1, 4, 1, 2))):
    mesh = restore.inference_mesh(workdir(trained_on, PARAMS))
    assert tuple(mesh.shape.values()) == want, trained_on
    assert set(mesh.devices.flat) == set(jax.local_devices())


def test_a_pod_mesh_becomes_every_local_device_on_fsdp():
  # 64 devices in training (fsdp 16 x tensor 4): this host has 8.
  mesh = restore.inference_mesh(
      workdir({'data': 1, 'fsdp': 16, 'tensor': 4}, PARAMS))
  assert sizes(mesh) == {'data': 1, 'fsdp': 8, 'sequence': 1,
                         'tensor': 1}


def test_fsdp_shrinks_to_the_devices_that_divide_the_parameters():
  odd = {'wi': ((12, 128), ('embed', 'mlp'))}  # 12: fsdp 8 does not divide
  mesh = restore.inference_mesh(
      workdir({'data': 1, 'fsdp': 16, 'tensor': 1}, odd))
  assert sizes(mesh) == {'data': 1, 'fsdp': 4, 'sequence': 1,
                         'tensor': 1}
  assert list(mesh.devices.flat) == jax.local_devices()[:4]
  prime = {'wi': ((7, 128), ('embed', 'mlp'))}
  mesh = restore.inference_mesh(workdir({'fsdp': -1}, prime))
  assert mesh.devices.size == 1


def test_given_devices_bound_the_mesh():
  two = jax.local_devices()[:2]
  mesh = restore.inference_mesh(workdir({'fsdp': -1}, PARAMS), two)
  assert sizes(mesh) == {'data': 1, 'fsdp': 2, 'sequence': 1,
                         'tensor': 1}
  assert list(mesh.devices.flat) == two
