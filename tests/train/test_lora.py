"""LoRA (model/lora.py): adapters as entries of the flat parameter dict, a
forward equal to the base model holding W + (alpha / r) A B, and training
that moves the adapters alone."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import repo
from flax import nnx

from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.model import lora, sharding
from jax_transformer.model import params as params_lib
from jax_transformer.train import model_setup, steps

# One xdist worker for the module: its models' ops and steps compile
# once, not once on each worker (one process ran it in about half its
# durations).
pytestmark = pytest.mark.xdist_group('lora')


LM = os.path.join(repo.ROOT, 'configs/lm_shakespeare.py')


def tiny_config(rank=4, targets='attention,mlp', **model):
  spec = importlib.util.spec_from_file_location('lm_config', LM)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config('tiny')
  cfg.model.update(dtype='float32', dropout_rate=0.0,
                   attention_dropout_rate=0.0, **model)
  cfg.lora.update(rank=rank, alpha=8.0, targets=targets)
  return cfg


def random_adapters(setup, seed=1):
  """Adapters with B non-zero (a fresh B is zero: no test of the sum)."""
  keys = iter(jax.random.split(jax.random.key(seed), 1000))
  return {k: 0.1 * jax.random.normal(next(keys), v.shape)
          for k, v in setup.abstract_params.items() if lora.is_adapter(k)}


def batch(vocab, b=2, t=16, seed=0):
  ids = np.random.default_rng(seed).integers(3, vocab, (b, t + 1))
  return {'inputs': jnp.asarray(ids[:, :-1]), 'targets': jnp.asarray(ids[:, 1:]),
          'segment_ids': jnp.ones((b, t), jnp.int32),
          'positions': jnp.broadcast_to(jnp.arange(t), (b, t))}


def logits(model, b):
  return np.asarray(steps.forward(model, b, True)[0])


@pytest.mark.parametrize('scan', [False, True])
def test_forward_equals_the_base_model_with_merged_weights(scan):
  setup = model_setup.build(Experiment.of(tiny_config(scan_layers=scan)), 100)
  params = jax.jit(lambda: setup.init_state(0))()['params']
  params.update(random_adapters(setup))
  lora_def = setup.model_def
  assert isinstance(lora_def, lora.LoraModelDef)
  # The merge by hand, in numpy float64: W + s A B per kernel.
  scale = 8.0 / 4
  base = {k: np.asarray(v, np.float64) for k, v in params.items()
          if not lora.is_adapter(k)}
  for t in lora_def.targets:
    a = np.asarray(params[t.kernel + '.lora_a'], np.float64)
    b = np.asarray(params[t.kernel + '.lora_b'], np.float64)
    n_stack = len(t.stack)
    a = a.reshape(*t.stack, -1, a.shape[-1])
    b = b.reshape(*t.stack, b.shape[n_stack], -1)
    base[t.kernel] = base[t.kernel] + scale * (a @ b).reshape(
        base[t.kernel].shape)
  plain = model_setup.build(Experiment.of(tiny_config(rank=0, scan_layers=scan)), 100)
  assert set(base) == set(plain.abstract_params)
  merged = plain.model_def.merge(
      {k: jnp.asarray(v, jnp.float32) for k, v in base.items()})
  b = batch(100)
  with jax.default_matmul_precision('highest'):
    got, want = logits(lora_def.merge(params), b), logits(merged, b)
  assert np.abs(got - want).max() < 1e-5
  # And the adapters matter (the sum above is not trivially zero).
  without = {k: v for k, v in params.items() if not lora.is_adapter(k)}
  assert np.abs(got - logits(plain.model_def.merge(without), b)).max() > 1e-3


def test_delta_is_flax_nnx_lora():
  """One kernel's merged weight gives nnx.LoRA's x W + (x A) B s."""
  setup = model_setup.build(Experiment.of(tiny_config(targets='wi')), 100)
  (target,) = [t for t in setup.model_def.targets
               if t.kernel == 'layers.0.ff.wi']
  d, f = target.in_shape[0], target.out_shape[0]
  rngs = nnx.Rngs(0)
  base = nnx.Linear(d, f, use_bias=False, rngs=rngs)
  layer = nnx.LoRA(d, 4, f, base_module=base, rngs=rngs)
  layer.lora_b[...] = 0.1 * jax.random.normal(jax.random.key(2), (4, f))
  x = jax.random.normal(jax.random.key(3), (5, d))
  a, b = layer.lora_a[...], layer.lora_b[...]
  scale = 2.0
  merged = base.kernel[...] + lora.delta(a, b, target, scale)
  # nnx.LoRA has no scale: fold it into B.
  layer.lora_b[...] = scale * b
  with jax.default_matmul_precision('highest'):
    assert np.abs(x @ merged - layer(x)).max() < 1e-5


def test_step_zero_is_the_base_model_and_only_adapters_train():
  cfg = tiny_config(targets='query,value')
  setup = model_setup.build(Experiment.of(cfg), 100)
  state = jax.jit(lambda: setup.init_state(0))()
  params = state['params']
  adapters = {k for k in params if lora.is_adapter(k)}
  assert adapters and all(k.endswith(('.lora_a', '.lora_b')) for k in adapters)
  assert {k.rsplit('.', 2)[-2] for k in adapters} == {'query', 'value'}
  # B starts at zero: the model is the base model, exactly.
  assert all(not np.any(np.asarray(params[k])) for k in adapters
             if k.endswith('.lora_b'))
  plain = model_setup.build(Experiment.of(tiny_config(rank=0)), 100)
  base = {k: v for k, v in params.items() if k not in adapters}
  b = batch(100)
  np.testing.assert_array_equal(logits(setup.model_def.merge(params), b),
                                logits(plain.model_def.merge(base), b))
  # The optimizer holds the adapters' moments alone.
  n_opt = sum(x.size for x in jax.tree.leaves(state['opt_state'])
              if getattr(x, 'ndim', 0) >= 2)
  n_adapters = sum(params[k].size for k in adapters)
  assert n_opt == 2 * n_adapters  # Adam's two moments
  step = jax.jit(steps.make_train_step(setup.model_def, setup.tx))
  before = jax.device_get(params)
  for _ in range(2):
    state, metrics = step(state, b)
  after = jax.device_get(state['params'])
  for k in params:
    if k in adapters:
      # B moves at step 1, A at step 2 (its gradient is s dW B^T).
      assert not np.array_equal(after[k], before[k]), k
    else:
      np.testing.assert_array_equal(after[k], before[k], err_msg=k)
  assert np.isfinite(metrics['loss'])


def test_adapters_have_logical_axes_that_shard():
  setup = model_setup.build(Experiment.of(tiny_config(scan_layers=True)), 100)
  axes = setup.model_def.logical_axes
  assert axes['layers.self_attn.query.lora_a'] == ('layers', 'embed',
                                                   'lora_rank')
  assert axes['layers.self_attn.query.lora_b'] == ('layers', 'lora_rank',
                                                   'heads', 'head_dim')
  assert axes['layers.self_attn.out.lora_a'] == ('layers', 'heads',
                                                 'head_dim', 'lora_rank')
  assert axes['layers.ff.wo.lora_b'] == ('layers', 'lora_rank', 'embed')
  specs = sharding.param_specs(axes)
  assert tuple(specs['layers.self_attn.query.lora_a']) == (None, 'fsdp', None)
  # Both layouts name the same adapters.
  unrolled = model_setup.build(Experiment.of(tiny_config(scan_layers=False)), 100)
  assert set(params_lib.scanned(unrolled.abstract_params)) == set(
      setup.abstract_params)


@pytest.mark.parametrize('targets, match', [
    ('nope', "'nope' matches no parameter"),
    ('scale', 'not a kernel'),
    ('embed.embedding', 'not a kernel'),
    ('', 'names no kernel'),
])
def test_bad_targets_are_refused_in_one_sentence(targets, match):
  with pytest.raises(UsageError, match=match) as e:
    model_setup.build(Experiment.of(tiny_config(targets=targets)), 100)
  assert '\n' not in str(e.value)


def test_rank_needs_init_from_and_a_positive_alpha():
  cfg = tiny_config()
  with pytest.raises(UsageError, match='set config.init_from'):
    Experiment.of(cfg).check()
  cfg.init_from = '/somewhere'
  Experiment.of(cfg).check()
  cfg.lora.alpha = 0.0
  with pytest.raises(UsageError, match='lora.alpha must be a positive'):
    Experiment.of(cfg).check()
  cfg.lora.rank = -1
  with pytest.raises(UsageError, match='lora.rank must be an integer'):
    Experiment.of(cfg).check()
