import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jax_transformer.experiment import OptimConfig
from jax_transformer.train import losses, optim


def test_rsqrt_schedule_is_the_papers_formula():
  schedule = optim.rsqrt_schedule(512, 4000)
  for step in (1, 100, 3999, 4000, 4001, 10_000, 100_000):
    want = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
    # Optax counts updates from 0: update count c is the paper's step c + 1.
    np.testing.assert_allclose(schedule(step - 1), want, rtol=1e-6)
  assert float(schedule(3999)) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)


def test_warmup_cosine_from_config():
  cfg = dict(schedule='warmup_cosine', learning_rate=1e-3, warmup_steps=10,
             final_lr_fraction=0.1)
  schedule = optim.make_schedule(OptimConfig(**cfg), 64, num_steps=110)
  np.testing.assert_allclose(schedule(0), 0.0)
  np.testing.assert_allclose(schedule(5), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(schedule(10), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(60), 0.55e-3, rtol=1e-5)
  np.testing.assert_allclose(schedule(110), 1e-4, rtol=1e-5)


@pytest.mark.parametrize('accum', [1, 2, 4])
def test_schedule_counts_updates_under_gradient_accumulation(accum):
  """Optax evaluates the schedule once per update, i.e. every `accum`
  train steps: warmup and decay still end at the same train step."""
  cfg = dict(schedule='warmup_cosine', learning_rate=1e-3, warmup_steps=8,
             final_lr_fraction=0.1, grad_accum_steps=accum)
  schedule = optim.make_schedule(OptimConfig(**cfg), 64, num_steps=40)
  np.testing.assert_allclose(schedule(8 // accum), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(40 // accum), 1e-4, rtol=1e-5)
  rsqrt = optim.make_schedule(
      OptimConfig(**dict(cfg, schedule='rsqrt', warmup_steps=4000)), 512,
      num_steps=10_000)
  peak = 512 ** -0.5 * (4000 // accum) ** -0.5
  np.testing.assert_allclose(rsqrt(4000 // accum - 1), peak, rtol=1e-6)


def test_bad_schedule_name():
  with pytest.raises(ValueError, match="optim.schedule must be"):
    optim.make_schedule(OptimConfig(schedule='linear', warmup_steps=0), 8, 10)


def adamw_cfg(**kw):
  return dict(dict(optimizer='adamw', b1=0.9, b2=0.98, eps=1e-9,
                   weight_decay=0.5, clip_norm=0.0), **kw)


def test_weight_decay_skips_norms_and_biases():
  params = {'w': jnp.ones((2, 2)), 'norm.scale': jnp.ones((2,)),
            'bias': jnp.ones((2,))}
  tx = optim.make_optimizer(OptimConfig(**adamw_cfg()),
                            optax.constant_schedule(0.1), params)
  zero = {k: jnp.zeros_like(v) for k, v in params.items()}
  updates, _ = tx.update(zero, tx.init(params), params)
  np.testing.assert_allclose(updates['w'], -0.05 * np.ones((2, 2)))
  np.testing.assert_array_equal(updates['norm.scale'], 0.0)
  np.testing.assert_array_equal(updates['bias'], 0.0)


def test_clipping_and_accumulation():
  params = {'w': jnp.zeros((3,))}
  grads = {'w': jnp.array([30.0, 40.0, 0.0])}
  tx = optax.chain(optax.clip_by_global_norm(1.0))
  clipped, _ = tx.update(grads, tx.init(params))
  np.testing.assert_allclose(clipped['w'], [0.6, 0.8, 0.0], rtol=1e-6)
  cfg = adamw_cfg(optimizer='adam', grad_accum_steps=2, clip_norm=1.0)
  tx = optim.make_optimizer(OptimConfig(**cfg), optax.constant_schedule(0.1),
                            params)
  state = tx.init(params)
  first, state = tx.update(grads, state, params)
  np.testing.assert_array_equal(first['w'], 0.0)  # accumulating
  second, state = tx.update(grads, state, params)
  assert np.abs(second['w']).max() > 0.0


def test_cross_entropy_sums_smoothing_and_z_loss():
  logits = jnp.array([[[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]]])
  targets = jnp.array([[0, 2]])
  weights = jnp.array([[1.0, 0.0]])
  out = losses.cross_entropy(logits, targets, weights)
  logp = jax_log_softmax(np.array([2.0, 0.0, -1.0]))
  np.testing.assert_allclose(out['nll'], -logp[0], rtol=1e-6)
  assert float(out['tokens']) == 1.0
  smooth = losses.cross_entropy(logits, targets, weights, 0.1)
  want = -(0.9 + 0.1 / 3) * logp[0] - (0.1 / 3) * (logp[1] + logp[2])
  np.testing.assert_allclose(smooth['loss'], want, rtol=1e-6)
  np.testing.assert_allclose(smooth['nll'], out['nll'])
  z = losses.cross_entropy(logits, targets, weights, 0.0, 1e-2)
  lse = np.log(np.exp([2.0, 0.0, -1.0]).sum())
  np.testing.assert_allclose(z['loss'] - out['loss'], 1e-2 * lse ** 2,
                             rtol=1e-5)


def jax_log_softmax(x):
  return x - np.log(np.exp(x).sum())
