"""LoRA's training forward, factored (x W + s (drop(x) A) B, model/
low_rank.py): the same loss and adapter gradients as the merged model, no
weight gradient of a frozen kernel, and the adapters' dropout."""

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jax_transformer.model import lora
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM, EncoderDecoder
from jax_transformer.model.params import abstract
from jax_transformer.train import model_setup, steps

# One xdist worker for the module: its models' ops and steps compile
# once, not once on each worker (one process ran it in about half its
# durations).
pytestmark = pytest.mark.xdist_group('lora_factored')


B, T = 3, 5  # sizes no kernel axis has (see test_no_weight_gradient...)

MODELS = {
    'lm': (DecoderLM, dict(num_encoder_layers=0, num_decoder_layers=2,
                           positional='learned', activation='gelu')),
    'lm_scanned_remat': (DecoderLM, dict(
        num_encoder_layers=0, num_decoder_layers=2, activation='swiglu',
        norm='rmsnorm', positional='rotary', num_kv_heads=1,
        tie_embeddings=False, use_bias=False, scan_layers=True,
        remat='dots')),
    'encoder_decoder': (EncoderDecoder, dict(num_encoder_layers=1,
                                             num_decoder_layers=1)),
}


def lora_model(kind, targets='attention,mlp', dropout=0.0, **fields):
  cls, defaults = MODELS[kind]
  config = ModelConfig(**{**dict(vocab_size=40, d_model=16, num_heads=2,
                                 d_ff=24, max_len=16, dropout_rate=0.0,
                                 attention_dropout_rate=0.0),
                          **defaults, **fields})
  model_def, shapes = lora.with_adapters(
      *abstract(lambda: cls(config, nnx.Rngs(0))), rank=4, alpha=8.0,
      targets=targets, dropout=dropout)
  base = nnx.state(cls(config, nnx.Rngs(0)))
  params = {'.'.join(map(str, p)): v[...] for p, v in nnx.to_flat_state(base)}
  # B non-zero (a fresh B is zero: every A would have a zero gradient).
  keys = iter(jax.random.split(jax.random.key(1), len(shapes)))
  params.update({k: 0.1 * jax.random.normal(next(keys), v.shape)
                 for k, v in shapes.items() if lora.is_adapter(k)})
  return model_def, params


def make_batch(kind, seed=0):
  rs = np.random.default_rng(seed)
  ids = lambda: jnp.asarray(rs.integers(3, 40, (B, T + 1)))  # noqa: E731
  ones, pos = jnp.ones((B, T), jnp.int32), jnp.broadcast_to(jnp.arange(T),
                                                            (B, T))
  seq = ids()
  if kind != 'encoder_decoder':
    return dict(inputs=seq[:, :-1], targets=seq[:, 1:], segment_ids=ones,
                positions=pos)
  return dict(src=ids()[:, :-1], src_segment_ids=ones, src_positions=pos,
              tgt_in=seq[:, :-1], tgt_out=seq[:, 1:], tgt_segment_ids=ones,
              tgt_positions=pos)


def mean_loss(build, params, batch, key=jax.random.key(0)):
  """Mean token loss of the module build(params, key) makes, in training."""
  def fn(trained):
    sums = steps.loss_sums(build({**lora.frozen(params), **trained}, key),
                           batch, False, nnx.Rngs(dropout=key))
    return sums['loss'] / sums['tokens']
  return jax.jit(jax.value_and_grad(fn))(lora.trainable(params))


@pytest.mark.parametrize('kind', list(MODELS))
def test_factored_loss_and_adapter_gradients_equal_the_merged(kind):
  model_def, params = lora_model(kind)
  batch = make_batch(kind)
  loss, grads = mean_loss(model_def.merge_for_training, params, batch)
  want_loss, want = mean_loss(lambda p, _: model_def.merge(p), params, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  assert set(grads) == set(want) and len(grads) > 4
  for name in want:
    g, w = np.asarray(grads[name]), np.asarray(want[name])
    # Relative to the tensor's largest entry: a tiny entry's own relative
    # error is rounding's, not the method's.
    assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max(), name
    assert np.abs(w).max() > 0, name


def _dot_shapes(jaxpr):
  """Output shapes of every dot_general in jaxpr and its inner jaxprs."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      yield tuple(eqn.outvars[0].aval.shape)
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(sub, jex.ClosedJaxpr):
          yield from _dot_shapes(sub.jaxpr)
        elif isinstance(sub, jex.Jaxpr):
          yield from _dot_shapes(sub)


@pytest.mark.parametrize('kind', ['lm', 'lm_scanned_remat'])
def test_no_weight_gradient_of_a_frozen_kernel_is_formed(kind):
  """No matmul of the train step makes a tensor of an adapted kernel's
  shape (its weight gradient, or the merged forward's A B): the merged
  forward's does."""
  model_def, params = lora_model(kind)
  tx = optax.adam(1e-3)
  state = model_setup.train_state(params, tx)
  kernels = {tuple(sorted((*t.in_shape, *t.out_shape)))
             for t in model_def.targets}

  def formed(def_):
    jaxpr = jax.make_jaxpr(steps.make_train_step(def_, tx))(
        state, make_batch(kind)).jaxpr
    return {s for s in _dot_shapes(jaxpr) if tuple(sorted(s)) in kernels}

  assert not formed(model_def)

  class Merged(type(model_def)):
    def merge_for_training(self, params, key):
      return self.merge(params)

  merged = Merged(model_def.graphdef, model_def.variables,
                  model_def.targets, model_def.rank, model_def.alpha)
  assert formed(merged)


@pytest.mark.parametrize('kind', ['lm', pytest.param(
    'lm_scanned_remat', marks=pytest.mark.slow)])
def test_dropout_zero_is_no_dropout_and_positive_is_train_only(kind):
  batch = make_batch(kind)

  def train_and_eval(dropout, seed=0):
    model_def, params = lora_model(kind, dropout=dropout)
    tx = optax.sgd(0.0)
    state = model_setup.train_state(params, tx, seed=seed)
    _, metrics = jax.jit(steps.make_train_step(model_def, tx))(state, batch)
    sums = jax.jit(steps.make_eval_step(model_def))(params, batch)
    return float(metrics['loss']), float(sums['nll']), metrics['grad_norm']

  train, evaluated, _ = train_and_eval(0.0)
  np.testing.assert_allclose(train, evaluated, rtol=1e-6)
  dropped, evaluated_again, grad_norm = train_and_eval(0.5)
  assert evaluated_again == evaluated  # evaluation is deterministic
  assert np.isfinite(dropped) and np.isfinite(grad_norm)
  assert abs(dropped - evaluated) > 1e-4 * abs(evaluated)
  assert train_and_eval(0.5)[0] == dropped  # given the run's rng
  assert train_and_eval(0.5, seed=1)[0] != dropped
