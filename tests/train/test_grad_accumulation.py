"""Gradient accumulation weighs every target token alike: k micro-steps make
the update of one step on the k micro-batches concatenated."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jax_transformer.cli import load_config
from jax_transformer.experiment import Experiment
from jax_transformer.model import sharding
from jax_transformer.train import checkpoint, model_setup, optim, steps

VOCAB = 64
T = 16


def lm_batch(lengths, seed):
  """A right-padded LM batch [B, T] with rows of the given real lengths."""
  rs = np.random.RandomState(seed)
  ids = rs.randint(3, VOCAB, (len(lengths), T + 1)).astype(np.int32)
  seg = (np.arange(T)[None] < np.array(lengths)[:, None]).astype(np.int32)
  return {'inputs': ids[:, :-1], 'targets': ids[:, 1:], 'segment_ids': seg,
          'positions': np.broadcast_to(np.arange(T, dtype=np.int32),
                                       seg.shape)}


def concat(a, b):
  return {k: np.concatenate([a[k], b[k]]) for k in a}


def tiny_cfg(accum, optimizer):
  """A one-layer LM without dropout (micro-steps and the one big step fold
  different dropout keys); eps large enough that Adam's step depends on the
  gradient's size, and a clip norm that every step reaches."""
  cfg = load_config('lm_shakespeare:tiny')
  cfg.model.dropout_rate = 0.0
  cfg.optim.update(optimizer=optimizer, schedule='constant',
                   learning_rate=1e-2, warmup_steps=0, eps=1e-4,
                   clip_norm=0.05, grad_accum_steps=accum)
  return cfg


def train(cfg, batches):
  """The params after one jitted train step per batch, from seed 0."""
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  step = jax.jit(steps.make_train_step(setup.model_def, setup.tx))
  state = setup.init_state(cfg.seed)
  for batch in batches:
    state, metrics = step(state, batch)
    # The clip norm is reached, so clipping is part of what is compared.
    assert float(metrics['grad_norm']) > cfg.optim.clip_norm
  return state


@pytest.mark.parametrize('optimizer', ['adam', 'adamw'])
def test_accumulated_updates_equal_steps_on_concatenated_batches(optimizer):
  # Micro-batches of 64 and of 5 target tokens: weighed per micro-batch, the
  # 5 tokens would count as much as the 64.
  full, short = [T] * 4, [2, 1, 1, 1]
  micro = [lm_batch(full, 0), lm_batch(short, 1), lm_batch(full, 2),
           lm_batch(short, 3)]
  accumulated = train(tiny_cfg(2, optimizer), micro)
  one_step = train(tiny_cfg(1, optimizer),
                   [concat(*micro[:2]), concat(*micro[2:])])
  start = model_setup.build(Experiment.of(tiny_cfg(1, optimizer)), VOCAB).init_state(0)
  for name, want in one_step['params'].items():
    got = accumulated['params'][name]
    assert not np.array_equal(want, start['params'][name]), name
    # Sums in another order (micro-batches against one batch): float32
    # rounding moves an update by about 1e-7; weighing micro-batches
    # per micro-batch would move them by the learning rate's scale (1e-2).
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=3e-7,
                               err_msg=name)


def test_without_accumulation_the_step_is_todays():
  """grad_accum_steps=1: the gradient of the loss per token, clipped, into
  AdamW, bit for bit (losses and params), whatever wraps the optimizer."""
  cfg = tiny_cfg(1, 'adamw')
  cfg.optim.update(eps=1e-9, clip_norm=0.5, schedule='warmup_cosine',
                   warmup_steps=2)
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  o = cfg.optim
  reference_tx = optax.chain(
      optax.clip_by_global_norm(o.clip_norm),
      optax.adamw(setup.schedule, b1=o.b1, b2=o.b2, eps=o.eps,
                  weight_decay=o.weight_decay,
                  mask=optim.decay_mask(setup.abstract_params)))

  @jax.jit
  def reference_step(params, opt_state, batch):
    def loss_fn(p):
      sums = steps.loss_sums(setup.model_def.merge(p), batch, True)
      return sums['loss'] / jnp.maximum(sums['tokens'], 1.0), sums['loss']
    grads, loss = jax.grad(loss_fn, has_aux=True)(params)
    updates, opt_state = reference_tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  step = jax.jit(steps.make_train_step(setup.model_def, setup.tx))
  state = setup.init_state(cfg.seed)
  params, opt_state = state['params'], reference_tx.init(state['params'])
  for seed in range(3):
    batch = lm_batch([T, 9, 3, 12], seed)
    state, metrics = step(state, batch)
    params, opt_state, loss = reference_step(params, opt_state, batch)
    np.testing.assert_array_equal(metrics['loss'], loss)
    for name, want in params.items():
      np.testing.assert_array_equal(state['params'][name], want,
                                    err_msg=name)


def test_the_run_ends_at_the_schedules_end_value():
  """40 train steps with grad_accum_steps=2 make 20 updates, after which
  the schedule is at its end value."""
  cfg = dict(tiny_cfg(2, 'adam').optim, schedule='warmup_cosine',
             learning_rate=1e-3, warmup_steps=8, final_lr_fraction=0.1)
  params = {'w': jnp.zeros((3,))}
  schedule, tx = optim.build(optim.OptimConfig(**cfg), 32, 40, params)
  update = jax.jit(lambda state: tx.update(
      {'w': jnp.ones((3,))}, state, params, loss=jnp.float32(1.0),
      tokens=jnp.float32(3.0))[1])
  state = tx.init(params)
  for _ in range(40):
    state = update(state)
  counts = optax.tree_utils.tree_get_all_with_path(state, 'count')
  assert counts and all(int(c) == 20 for _, c in counts), counts
  np.testing.assert_allclose(schedule(counts[0][1]), 1e-4, rtol=1e-5)


@pytest.mark.slow
def test_accumulator_is_sharded_like_params_and_checkpointed(tmp_path):
  cfg = tiny_cfg(2, 'adamw')
  cfg.mesh.update(data=2, fsdp=2, tensor=2)
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  mesh = sharding.make_mesh(cfg.mesh)
  abstract = setup.abstract_state(cfg.seed)
  shardings, param_specs = steps.state_shardings(setup, mesh, abstract)
  grad_sum = shardings['opt_state'].grad_sum
  assert {k: s.spec for k, s in grad_sum.items()} == param_specs
  step = jax.jit(steps.make_train_step(setup.model_def, setup.tx),
                 in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings, None))
  state = jax.jit(lambda: setup.init_state(cfg.seed),
                  out_shardings=shardings)()
  state, _ = step(state, lm_batch([T, 5, 3, 1, 2, 2, 7, 9], 0))
  saver = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  saver.save(state, {'position': 1})
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      abstract, shardings)
  restored, _ = saver.restore(abstract)
  saver.close()
  accumulator = restored['opt_state']
  assert int(accumulator.micro_step) == 1
  assert float(accumulator.tokens) == T + 29
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    np.testing.assert_array_equal(got, want)


def test_a_checkpoint_of_the_multisteps_state_is_refused_in_one_sentence(
    tmp_path):
  """A checkpoint written before per-token accumulation (optax.MultiSteps
  around clipping and Adam) does not restore, and one sentence says why."""
  cfg = tiny_cfg(2, 'adam')
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  state = setup.init_state(cfg.seed)
  o = cfg.optim
  old_tx = optax.MultiSteps(optax.chain(
      optax.clip_by_global_norm(o.clip_norm),
      optax.adam(setup.schedule, b1=o.b1, b2=o.b2, eps=o.eps)),
                            every_k_schedule=2)
  saver = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  saver.save(dict(state, opt_state=old_tx.init(state['params'])),
             {'position': 0})
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one),
      setup.abstract_state(cfg.seed))
  with pytest.raises(checkpoint.CheckpointMismatch) as caught:
    saver.restore(abstract)
  saver.close()
  assert str(caught.value) == (
      f'Checkpoint step 0 in {tmp_path}/checkpoints holds '
      'opt_state.acc_grads.embed.embedding, which this config does not '
      'build: the optimizer state changed (optim.optimizer, clip_norm on or '
      'off, grad_accum_steps above 1 or not, or a version before per-token '
      'accumulation); resume with the config it was trained with or use a '
      'new --workdir.')
