"""Layers and whole models against PyTorch: forward to 1e-5, gradients 1e-4."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx
from torch_helpers import load_module, n, randomize, t

import jax_transformer as jt
from jax_transformer.interop import torch_compat as tc
from jax_transformer.interop.torch_reference import TorchTransformer
from jax_transformer.model import masks
from jax_transformer.model.blocks import DecoderLayer, EncoderLayer

BASE = jt.ModelConfig(vocab_size=61, d_model=32, num_heads=4, d_ff=64,
                      num_encoder_layers=2, num_decoder_layers=2)


def torch_layer_kwargs(config):
  return dict(d_model=config.d_model, nhead=config.num_heads,
              dim_feedforward=config.d_ff, dropout=0.0,
              activation=config.activation, batch_first=True,
              norm_first=config.norm_first)


def encoder_layer_entries(config):
  def entries(tp, jp):
    return (tc._mha_entries(f'{tp}.self_attn', f'{jp}.self_attn', config)
            + tc._ff_entries(tp, jp, config)
            + tc._norm_entries(f'{tp}.norm1', f'{jp}.self_attn_norm')
            + tc._norm_entries(f'{tp}.norm2', f'{jp}.ff_norm'))
  return entries


def decoder_layer_entries(config):
  def entries(tp, jp):
    return (encoder_layer_entries(config)(tp, jp)[:-4]
            + tc._mha_entries(f'{tp}.multihead_attn', f'{jp}.cross_attn',
                              config)
            + tc._norm_entries(f'{tp}.norm1', f'{jp}.self_attn_norm')
            + tc._norm_entries(f'{tp}.norm2', f'{jp}.cross_attn_norm')
            + tc._norm_entries(f'{tp}.norm3', f'{jp}.ff_norm'))
  return entries


@pytest.mark.parametrize('norm_first', [False, True])
def test_encoder_layer_matches_torch(norm_first):
  config = BASE.replace(norm_first=norm_first)
  layer = randomize(torch.nn.TransformerEncoderLayer(
      **torch_layer_kwargs(config))).eval()
  ours = load_module(layer, lambda: EncoderLayer(config, nnx.Rngs(0)),
                     encoder_layer_entries(config))
  x = np.random.RandomState(0).randn(2, 7, 32).astype(np.float32)
  real = np.array([[1] * 7, [1] * 5 + [0] * 2], bool)
  want = n(layer(t(x), src_key_padding_mask=t(~real)))
  got = ours(jnp.asarray(x), masks.padding_mask(jnp.asarray(real)),
             jnp.broadcast_to(jnp.arange(7), (2, 7)))
  np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=1e-5)


@pytest.mark.parametrize('norm_first', [False, True])
def test_decoder_layer_matches_torch(norm_first):
  config = BASE.replace(norm_first=norm_first, activation='gelu')
  layer = randomize(torch.nn.TransformerDecoderLayer(
      **torch_layer_kwargs(config)), seed=3).eval()
  ours = load_module(
      layer, lambda: DecoderLayer(config, nnx.Rngs(0), cross_attention=True),
      decoder_layer_entries(config))
  rs = np.random.RandomState(0)
  x, mem = (rs.randn(2, 5, 32).astype(np.float32),
            rs.randn(2, 7, 32).astype(np.float32))
  src_real = np.array([[1] * 7, [1] * 4 + [0] * 3], bool)
  want = n(layer(t(x), t(mem),
                 tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(5),
                 memory_key_padding_mask=t(~src_real)))
  got, cache = ours(
      jnp.asarray(x), masks.causal_mask(jnp.arange(5), jnp.arange(5)),
      jnp.broadcast_to(jnp.arange(5), (2, 5)),
      memory_kv=ours.cross_attn.project_kv(jnp.asarray(mem)),
      memory_mask=masks.padding_mask(jnp.asarray(src_real)))
  assert cache is None
  np.testing.assert_allclose(got, want, atol=1e-5)


def reference_and_model(config, seed=0):
  ref = randomize(TorchTransformer.from_config(config), seed).eval()
  return ref, tc.encoder_decoder_from_torch(ref.state_dict(), config)


def example_batch(padded: bool, seed=0):
  rs = np.random.RandomState(seed)
  src = rs.randint(3, 61, (3, 9))
  tgt = rs.randint(3, 61, (3, 6))
  src_real = np.ones((3, 9), bool)
  tgt_real = np.ones((3, 6), bool)
  if padded:
    src_real[1, 6:] = src_real[2, 4:] = False
    tgt_real[1, 4:] = tgt_real[2, 2:] = False
    src[~src_real] = tgt[~tgt_real] = 0
  return src, tgt, src_real, tgt_real


# (norm_first, activation, padded, tied): every pair of values of every two
# of the four options once (a pairwise cover of the 2^4 grid in 5 cases).
# The options touch different parts of the model (layer order, the
# feed-forward's activation, the masks, the output head), so a fault in
# one, or between two, shows in a case holding it; the full grid ran 16.
CASES = [(False, 'relu', False, False), (False, 'gelu', True, True),
         (True, 'relu', True, True), (True, 'gelu', False, True),
         (True, 'gelu', True, False)]


@pytest.mark.parametrize('norm_first, activation, padded, tied', CASES)
def test_encoder_decoder_logits_match_torch(norm_first, activation, padded,
                                            tied):
  config = BASE.replace(norm_first=norm_first, activation=activation,
                        tie_embeddings=tied)
  ref, model = reference_and_model(config)
  src, tgt, src_real, tgt_real = example_batch(padded)
  with torch.no_grad():
    want = n(ref(t(src), t(tgt), t(~src_real) if padded else None,
                 t(~tgt_real) if padded else None))
  got = np.asarray(model(jnp.asarray(src), jnp.asarray(tgt),
                         jnp.asarray(src_real) if padded else None,
                         jnp.asarray(tgt_real) if padded else None))
  # Compare real positions only: torch's fast path may zero padded ones.
  np.testing.assert_allclose(got[tgt_real], want[tgt_real], atol=1e-5)
  assert np.abs(want[tgt_real]).max() > 1.0  # non-trivial logits


def torch_loss(logits, tgt_out, real):
  losses = torch.nn.functional.cross_entropy(
      logits.transpose(1, 2), tgt_out, reduction='none')
  return (losses * real).sum() / real.sum()


@pytest.mark.slow
@pytest.mark.parametrize('norm_first, tied', [(False, True), (True, False)])
def test_encoder_decoder_gradients_match_torch(norm_first, tied):
  config = BASE.replace(norm_first=norm_first, tie_embeddings=tied,
                        dropout_rate=0.0, attention_dropout_rate=0.0)
  ref, model = reference_and_model(config, seed=4)
  src, tgt, src_real, tgt_real = example_batch(padded=True, seed=1)
  tgt_out = np.roll(tgt, -1, axis=1)
  loss = torch_loss(ref(t(src), t(tgt), t(~src_real), t(~tgt_real)),
                    t(tgt_out), t(tgt_real.astype(np.float32)))
  loss.backward()
  want = {k: n(p.grad) for k, p in ref.named_parameters()}

  graphdef, params = nnx.split(model)

  def jax_loss(params):
    logits = nnx.merge(graphdef, params)(
        jnp.asarray(src), jnp.asarray(tgt), jnp.asarray(src_real),
        jnp.asarray(tgt_real))
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.asarray(tgt_out))
    return (ce * tgt_real).sum() / tgt_real.sum()

  value, grads = jax.value_and_grad(jax_loss)(params)
  np.testing.assert_allclose(value, loss.item(), rtol=1e-5)
  got = tc.encoder_decoder_to_torch(nnx.merge(graphdef, grads))
  assert set(want) <= set(got)
  for key, g in want.items():
    scale = np.abs(g).max()
    assert scale > 0, key
    np.testing.assert_allclose(got[key], g, rtol=1e-4, atol=1e-4 * scale,
                               err_msg=key)


def test_encode_is_the_torch_encoder():
  config = BASE
  ref, model = reference_and_model(config, seed=2)
  src, _, src_real, _ = example_batch(padded=True)
  with torch.no_grad():
    want = n(ref.transformer.encoder(ref.encode_tokens(t(src)),
                                     src_key_padding_mask=t(~src_real)))
  got = np.asarray(model.encode(jnp.asarray(src), jnp.asarray(src_real)))
  np.testing.assert_allclose(got[src_real], want[src_real], atol=1e-5)
