"""Each layer against PyTorch (float32, CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch.nn import functional as F
from torch_helpers import load_module, n, randomize, t

import jax_transformer as jt
from jax_transformer.interop import torch_compat as tc
from jax_transformer.interop.torch_reference import (
  sinusoidal as torch_sinusoidal,
)
from jax_transformer.model import layers

CONFIG = jt.ModelConfig(vocab_size=50, d_model=16, num_heads=4, d_ff=32,
                        num_encoder_layers=1, num_decoder_layers=1)


def test_sinusoidal_equals_the_seed():
  got = layers.sinusoidal(jnp.arange(60), 32)
  # XLA's float32 division may differ from torch's by an ulp of the angle
  # (3.8e-6 at angle 60).
  np.testing.assert_allclose(got, n(torch_sinusoidal(60, 32)), atol=1e-5)
  # Interleaved: even dims sin, odd dims cos of the same angle.
  np.testing.assert_allclose(got[:, 0], np.sin(np.arange(60)), atol=1e-6)
  np.testing.assert_allclose(got[:, 1], np.cos(np.arange(60)), atol=1e-6)


def test_embedding_is_scaled_by_sqrt_d_model():
  embed = layers.Embed(CONFIG, nnx.Rngs(0))
  ids = jnp.array([[3, 7]])
  np.testing.assert_allclose(embed(ids), embed.embedding[...][ids] * 4.0,
                             rtol=1e-6)
  unscaled = layers.Embed(CONFIG.replace(scale_embeddings=False),
                          nnx.Rngs(0))
  np.testing.assert_allclose(unscaled(ids), unscaled.embedding[...][ids])


def test_layer_norm_matches_torch():
  ln = randomize(torch.nn.LayerNorm(16, eps=1e-5), seed=1)
  ours = load_module(ln, lambda: layers.LayerNorm(CONFIG, nnx.Rngs(0)),
                     tc._norm_entries)
  x = np.random.RandomState(0).randn(2, 5, 16).astype(np.float32) * 3 + 1
  np.testing.assert_allclose(ours(jnp.asarray(x)), n(ln(t(x))), atol=1e-5)


def test_rms_norm_matches_torch():
  rms = torch.nn.RMSNorm(16, eps=1e-5)
  with torch.no_grad():
    rms.weight.copy_(torch.linspace(0.5, 1.5, 16))
  ours = layers.RMSNorm(CONFIG, nnx.Rngs(0))
  ours.scale[...] = jnp.linspace(0.5, 1.5, 16)
  x = np.random.RandomState(0).randn(2, 5, 16).astype(np.float32)
  np.testing.assert_allclose(ours(jnp.asarray(x)), n(rms(t(x))), atol=1e-5)


@pytest.mark.parametrize('activation, torch_fn', [
    ('relu', F.relu), ('gelu', F.gelu),
    ('gelu_tanh', lambda x: F.gelu(x, approximate='tanh'))])
def test_feed_forward_matches_torch(activation, torch_fn):
  config = CONFIG.replace(activation=activation)
  lin1, lin2 = randomize(torch.nn.Linear(16, 32)), randomize(
      torch.nn.Linear(32, 16), seed=1)
  ff = torch.nn.Module()
  ff.linear1, ff.linear2 = lin1, lin2

  def entries(tp, jp):
    # FeedForward sits at 'part.ff' under the holder: strip the 'ff.' level.
    return [tc.Entry(e.torch_key, tuple(p.replace('.ff.', '.') for p in
                                        e.jax_paths), e.to_torch, e.from_torch)
            for e in tc._ff_entries(tp, jp, config)]
  ours = load_module(ff, lambda: layers.FeedForward(config, nnx.Rngs(0)),
                     entries)
  x = np.random.RandomState(0).randn(2, 5, 16).astype(np.float32)
  want = lin2(torch_fn(lin1(t(x))))
  np.testing.assert_allclose(ours(jnp.asarray(x)), n(want), atol=1e-5)


def test_swiglu_matches_its_formula_in_torch():
  config = CONFIG.replace(activation='swiglu')
  ff = layers.FeedForward(config, nnx.Rngs(3))
  x = np.random.RandomState(0).randn(2, 5, 16).astype(np.float32)
  wi, gate, wo = (t(np.asarray(getattr(ff, k)[...]))
                  for k in ('wi', 'wi_gate', 'wo'))
  want = (F.silu(t(x) @ gate) * (t(x) @ wi)) @ wo
  np.testing.assert_allclose(ff(jnp.asarray(x)), n(want), atol=1e-5)
  assert not hasattr(ff, 'bi')


def torch_rope(x, positions, base=10000.0):
  """Rotate-half RoPE written directly from the definition, in torch."""
  half = x.shape[-1] // 2
  inv = base ** (-torch.arange(half, dtype=torch.float32) / half)
  angle = positions[:, :, None, None].float() * inv
  x1, x2 = x[..., :half], x[..., half:]
  return torch.cat([x1 * angle.cos() - x2 * angle.sin(),
                    x2 * angle.cos() + x1 * angle.sin()], -1)


def test_rotary_matches_torch_and_is_relative():
  rs = np.random.RandomState(0)
  x = rs.randn(2, 6, 3, 8).astype(np.float32)
  pos = np.stack([np.arange(6), np.arange(6) + 11])
  got = layers.rotate(jnp.asarray(x), jnp.asarray(pos), 10000.0)
  np.testing.assert_allclose(got, n(torch_rope(t(x), t(pos))), atol=1e-5)
  # Scores depend only on the offset between query and key positions.
  q, k = jnp.asarray(x[:1, :1]), jnp.asarray(x[:1, 1:2])
  def score(pq, pk):
    return jnp.sum(layers.rotate(q, jnp.array([[pq]]), 1e4) *
                   layers.rotate(k, jnp.array([[pk]]), 1e4), -1)
  np.testing.assert_allclose(score(3, 1), score(13, 11), atol=1e-5)
  assert not np.allclose(score(3, 1), score(3, 2), atol=1e-3)


def test_learned_positions_index_the_table():
  config = CONFIG.replace(positional='learned', max_len=10)
  pos = layers.LearnedPositions(config, nnx.Rngs(0))
  ids = jnp.array([[0, 4, 9]])
  np.testing.assert_array_equal(pos(ids), pos.embedding[...][ids])


def test_dropout_needs_rngs_and_keeps_the_mean():
  x = jnp.ones((1000, 100))
  with pytest.raises(ValueError, match='rngs=nnx.Rngs'):
    layers.dropout(x, 0.1, None, deterministic=False)
  y = layers.dropout(x, 0.1, nnx.Rngs(dropout=0), deterministic=False)
  assert abs(float((y == 0).mean()) - 0.1) < 0.01
  assert abs(float(y.mean()) - 1.0) < 0.01
  np.testing.assert_array_equal(layers.dropout(x, 0.1, None, True), x)


@pytest.mark.parametrize('rng', ['hash', 'threefry'])
def test_dropout_keep_rate_and_scale_for_each_source_of_bits(rng):
  x = jnp.ones((1000, 1000))
  y = layers.dropout(x, 0.1, nnx.Rngs(dropout=3), False, rng)
  dropped = float((y == 0).mean())
  # Binomial standard deviation over 1e6 draws is 3e-4.
  assert abs(dropped - 0.1) < 2e-3
  np.testing.assert_allclose(np.unique(np.asarray(y)), [0.0, 1 / 0.9])


def test_threefry_dropout_is_the_old_bernoulli_path():
  x = jax.random.normal(jax.random.key(1), (64, 32))
  y = layers.dropout(x, 0.2, nnx.Rngs(dropout=5), False, 'threefry')
  key = nnx.Rngs(dropout=5).dropout()
  keep = jax.random.bernoulli(key, 0.8, x.shape)
  np.testing.assert_array_equal(y, jnp.where(keep, x / 0.8, 0.0))


def test_hash_bits_are_deterministic_uniform_and_independent_per_key():
  bits = lambda seed, shape: np.asarray(  # noqa: E731
      layers.hash_bits(nnx.Rngs(dropout=seed), shape), np.float64)
  a, again, b = bits(0, (512, 512)), bits(0, (512, 512)), bits(1, (512, 512))
  np.testing.assert_array_equal(a, again)
  u, v = a / 2 ** 32, b / 2 ** 32
  assert abs(u.mean() - 0.5) < 3e-3 and abs(u.var() - 1 / 12) < 2e-3
  # Neighbouring elements, and the same element under two keys, are
  # uncorrelated (|r| well under 4 / sqrt(n) ~ 0.008).
  for x, y in ((u[:, :-1], u[:, 1:]), (u[:-1], u[1:]), (u, v)):
    assert abs(np.corrcoef(x.ravel(), y.ravel())[0, 1]) < 0.008
  # Bits are balanced: each of the 32 is set about half the time.
  ints = np.asarray(layers.hash_bits(nnx.Rngs(dropout=2), (256, 256)))
  ones = [((ints >> i) & 1).mean() for i in range(32)]
  assert max(abs(o - 0.5) for o in ones) < 0.01


def test_each_dropout_call_draws_a_new_mask():
  rngs = nnx.Rngs(dropout=0)
  x = jnp.ones((256, 256))
  m1 = layers.dropout(x, 0.5, rngs, False, 'hash') == 0
  m2 = layers.dropout(x, 0.5, rngs, False, 'hash') == 0
  agree = float((m1 == m2).mean())
  assert abs(agree - 0.5) < 0.01  # independent masks agree half the time


@pytest.mark.parametrize('activation', ['gelu', 'swiglu'])
def test_feed_forward_on_rows_equals_its_batch_by_length_form(activation):
  """The projections multiply [B*T, D] rows (a third of the default job's
  step went to a transposed copy with B and T apart): output and
  gradients, dropout on, equal the [B, T, D] einsums of the same weights
  and dropout bits."""
  config = CONFIG.replace(activation=activation, dropout_rate=0.1,
                          dropout_rng='hash', d_model=32, d_ff=96)
  ff = layers.FeedForward(config, nnx.Rngs(1))
  graphdef, params = nnx.split(ff)
  x = jnp.asarray(np.random.RandomState(2).randn(3, 7, 32), jnp.float32)

  def rows(params, x):
    return nnx.merge(graphdef, params)(x, nnx.Rngs(dropout=5), False)

  def batch_by_length(params, x):
    p = nnx.merge(graphdef, params)
    h = jnp.einsum('BTD,DF->BTF', x, p.wi[...])
    if activation == 'swiglu':
      h = jax.nn.silu(jnp.einsum('BTD,DF->BTF', x, p.wi_gate[...])) * h
    else:
      h = jax.nn.gelu(h + p.bi[...], approximate=False)
    h = layers.dropout(h, 0.1, nnx.Rngs(dropout=5), False, 'hash')
    y = jnp.einsum('BTF,FD->BTD', h, p.wo[...])
    return y if activation == 'swiglu' else y + p.bo[...]

  def loss_and_grads(f):
    return jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(f(p, x) ** 2),
                                      argnums=(0, 1)))(params, x)

  (got, (gp, gx)), (want, (wp, wx)) = map(loss_and_grads,
                                          (rows, batch_by_length))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(gx, wx, rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(wp)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
