"""Attention against nn.MultiheadAttention and scaled_dot_product_attention."""

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
from jax_transformer.model import attention as attn
from jax_transformer.model import masks

CONFIG = jt.ModelConfig(vocab_size=50, d_model=16, num_heads=4, d_ff=32)


def load_mha(mha, config=CONFIG):
  return load_module(
      mha, lambda: attn.Attention(config, nnx.Rngs(0), rotary=False),
      lambda tp, jp: tc._mha_entries(tp, jp, config))


@pytest.mark.parametrize('causal', [False, True])
def test_self_attention_matches_torch(causal):
  mha = randomize(torch.nn.MultiheadAttention(16, 4, batch_first=True)).eval()
  ours = load_mha(mha)
  x = np.random.RandomState(0).randn(2, 6, 16).astype(np.float32)
  real = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
  want, _ = mha(t(x), t(x), t(x), key_padding_mask=t(~real),
                attn_mask=(torch.nn.Transformer.generate_square_subsequent_mask(
                    6) if causal else None), need_weights=False)
  mask = masks.combine(
      masks.padding_mask(jnp.asarray(real)),
      masks.causal_mask(jnp.arange(6), jnp.arange(6)) if causal else None)
  got = ours(jnp.asarray(x), mask)
  np.testing.assert_allclose(got, n(want), atol=1e-5)


def test_cross_attention_matches_torch():
  mha = randomize(torch.nn.MultiheadAttention(16, 4, batch_first=True),
                  seed=2).eval()
  ours = load_mha(mha)
  rs = np.random.RandomState(1)
  x, mem = (rs.randn(2, 3, 16).astype(np.float32),
            rs.randn(2, 7, 16).astype(np.float32))
  real = np.array([[1] * 7, [1] * 5 + [0] * 2], bool)
  want, _ = mha(t(x), t(mem), t(mem), key_padding_mask=t(~real),
                need_weights=False)
  k, v = ours.project_kv(jnp.asarray(mem))
  got = ours.attend(ours.project_query(jnp.asarray(x)), k, v,
                    masks.padding_mask(jnp.asarray(real)))
  np.testing.assert_allclose(got, n(want), atol=1e-5)


def test_grouped_query_attention_matches_torch_sdpa():
  config = CONFIG.replace(num_kv_heads=2)
  layer = attn.Attention(config, nnx.Rngs(5), rotary=False)
  x = jnp.asarray(np.random.RandomState(0).randn(2, 5, 16), jnp.float32)
  q, (k, v) = layer.project_query(x), layer.project_kv(x)
  assert k.shape == (2, 5, 2, 4)
  want = F.scaled_dot_product_attention(
      t(q).transpose(1, 2), t(k).transpose(1, 2), t(v).transpose(1, 2),
      is_causal=True, enable_gqa=True).transpose(1, 2)
  mask = masks.causal_mask(jnp.arange(5), jnp.arange(5))
  got = jax.nn.dot_product_attention(q, k, v, mask=mask)
  np.testing.assert_allclose(got, n(want), atol=1e-5)
  # The explicit (dropout) path groups heads the same way.
  weights = attn.attention_weights(q, k, mask)
  explicit = jnp.einsum('BNTS,BSNH->BTNH', weights, jnp.repeat(v, 2, axis=2))
  np.testing.assert_allclose(explicit, n(want), atol=1e-5)


def test_seed_worked_example_causal_weights():
  """Seed 001: Q = K = V = X, causal mask, weights rounded to 3 places."""
  torch.manual_seed(7)
  x = jnp.asarray(n(torch.randn(3, 4)))[None, :, None, :]
  weights = attn.attention_weights(
      x, x, masks.causal_mask(jnp.arange(3), jnp.arange(3)))
  expected = [[1.0, 0.0, 0.0], [0.018, 0.982, 0.0], [0.074, 0.33, 0.595]]
  np.testing.assert_allclose(np.round(weights[0, 0], 3), expected, atol=1e-9)


def test_attention_dropout_path_is_used_in_training():
  config = CONFIG.replace(attention_dropout_rate=0.5)
  layer = attn.Attention(config, nnx.Rngs(0), rotary=False)
  x = jnp.asarray(np.random.RandomState(0).randn(1, 8, 16), jnp.float32)
  eval_out = layer(x)
  a = layer(x, rngs=nnx.Rngs(dropout=1), deterministic=False)
  b = layer(x, rngs=nnx.Rngs(dropout=1), deterministic=False)
  c = layer(x, rngs=nnx.Rngs(dropout=2), deterministic=False)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, eval_out, atol=1e-3)
  assert not np.allclose(a, c, atol=1e-3)


def test_segment_mask_blocks_other_segments_and_padding():
  seg = jnp.array([[1, 1, 2, 2, 0]])
  m = masks.segment_mask(seg, seg)[0, 0]
  assert m.shape == (5, 5)
  assert bool(m[0, 1]) and bool(m[2, 3])
  assert not bool(m[1, 2]) and not bool(m[2, 1]) and not m[:, 4].any()
