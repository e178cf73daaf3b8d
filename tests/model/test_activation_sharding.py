"""Activations are laid out by the logical-axis rules on the 8-device mesh."""


import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.cli import load_config
from jax_transformer.experiment import Experiment
from jax_transformer.model import sharding
from jax_transformer.train import model_setup, steps

# One xdist worker for the module: its programs compile once, not once
# on each worker (one process ran it in about two thirds of its
# durations).
pytestmark = pytest.mark.xdist_group('activation_sharding')


VOCAB, B, T, D, F = 64, 8, 16, 32, 96


def _setup(mesh_sizes, **model):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.model.update(d_model=D, num_heads=4, num_kv_heads=2, d_ff=F,
                   dropout_rate=0.0, **model)
  cfg.mesh.update(mesh_sizes)
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  mesh = sharding.make_mesh(cfg.mesh, None if mesh_sizes['data'] != 1 or
                            mesh_sizes['tensor'] != 1 else jax.devices()[:1])
  shardings, _ = steps.state_shardings(setup, mesh,
                                         setup.abstract_state(cfg.seed))
  step = jax.jit(steps.make_train_step(setup.model_def, setup.tx),
                 in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings,
                                NamedSharding(mesh, PartitionSpec())))
  state = jax.jit(lambda: setup.init_state(cfg.seed),
                  out_shardings=shardings)()
  return mesh, step, state


def _batch():
  rs = np.random.RandomState(0)
  ids = rs.randint(3, VOCAB, (B, T + 1)).astype(np.int32)
  return {'inputs': ids[:, :-1], 'targets': ids[:, 1:],
          'segment_ids': np.ones((B, T), np.int32),
          'positions': np.broadcast_to(np.arange(T, dtype=np.int32), (B, T))}


def _lower(mesh, step, state, with_rules: bool):
  batch = jax.device_put(_batch(), sharding.batch_sharding(mesh))
  if not with_rules:
    return step.lower(state, batch)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return step.lower(state, batch)


def test_compiled_step_shards_activations_as_the_rules_say():
  mesh, step, state = _setup({'data': 2, 'fsdp': 2, 'tensor': 2},
                             scan_layers=True)
  lowered = _lower(mesh, step, state, True)
  text = lowered.as_text()
  batch_axes = '{"data", "fsdp"}'
  # The residual stream [B, T, D]: batch split, embed whole.
  assert f'[{batch_axes}, {{}}, {{}}]' in text
  # MLP features [B, T, F] and logits [B, T, V]: also split over 'tensor'.
  assert f'[{batch_axes}, {{}}, {{"tensor"}}]' in text
  # Queries, keys, values, contexts [B, T, N, H]: heads over 'tensor'.
  assert f'[{batch_axes}, {{}}, {{"tensor"}}, {{}}]' in text
  # Without a mesh in context the models add no constraint at all, so the
  # lines above come from the rules.
  bare = _lower(mesh, step, state, False).as_text()
  assert 'sharding_constraint' not in bare and 'sharding_constraint' in text
  # After partitioning, each device computes its slice of the MLP: a
  # quarter of the batch and half of the features.
  hlo = lowered.compile().as_text()
  assert f'f32[{B // 4},{T},{F // 2}]' in hlo


@pytest.mark.slow
def test_constrained_step_equals_one_device():
  one = _setup({'data': 1, 'fsdp': 1, 'tensor': 1})
  eight = _setup({'data': 2, 'fsdp': 2, 'tensor': 2})
  losses = []
  for mesh, step, state in (one, eight):
    batch = jax.device_put(_batch(), sharding.batch_sharding(mesh))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      _, metrics = step(state, batch)
    losses.append(float(metrics['loss'] / metrics['tokens']))
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
