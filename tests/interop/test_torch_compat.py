"""State-dict layouts: exact round trips, clear errors, and GPT-2 parity."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from torch_helpers import n, randomize, t

import jax_transformer as jt
from jax_transformer.interop import torch_compat as tc
from jax_transformer.interop.torch_reference import TorchTransformer

SMALL = jt.ModelConfig(vocab_size=40, d_model=16, num_heads=4, d_ff=32,
                       num_encoder_layers=2, num_decoder_layers=2)
GPT2 = jt.gpt2_small(vocab_size=97, d_model=32, num_heads=4, d_ff=128,
                     num_decoder_layers=2, max_len=64)


def gpt2_reference(seed=0):
  torch.manual_seed(seed)
  hf_config = transformers.GPT2Config(
      vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4,
      activation_function='gelu_new', resid_pdrop=0.0, embd_pdrop=0.0,
      attn_pdrop=0.0)
  hf_config._attn_implementation = 'eager'
  return randomize(transformers.GPT2LMHeadModel(hf_config), seed).eval()


@pytest.mark.parametrize('tied', [True, False])
def test_encoder_decoder_round_trip_is_exact(tied):
  config = SMALL.replace(tie_embeddings=tied)
  model = jt.EncoderDecoder(config, nnx.Rngs(1))
  exported = tc.encoder_decoder_to_torch(model)
  ref = TorchTransformer.from_config(config)
  assert set(exported) == set(ref.state_dict())
  ref.load_state_dict({k: t(v) for k, v in exported.items()})
  back = tc.encoder_decoder_to_torch(
      tc.encoder_decoder_from_torch(ref.state_dict(), config))
  for key, value in exported.items():
    np.testing.assert_array_equal(back[key], value, err_msg=key)
  # And the JAX parameters themselves survive the trip.
  again = tc.encoder_decoder_from_torch(exported, config)
  for a, b in zip(jax_leaves(model), jax_leaves(again)):
    np.testing.assert_array_equal(a, b)


def jax_leaves(model):
  return [v[...] for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]


def test_gpt2_round_trip_is_exact():
  hf = gpt2_reference()
  model = tc.decoder_lm_from_gpt2(hf.state_dict(), GPT2)
  exported = tc.decoder_lm_to_gpt2(model)
  for key, value in hf.state_dict().items():
    if key in exported:
      np.testing.assert_array_equal(exported[key], n(value), err_msg=key)
  params = {k for k, _ in hf.named_parameters()}
  assert params <= set(exported)


def test_gpt2_logits_match_transformers():
  hf = gpt2_reference(seed=3)
  model = tc.decoder_lm_from_gpt2(hf.state_dict(), GPT2)
  ids = np.random.RandomState(0).randint(0, 97, (2, 11))
  with torch.no_grad():
    want = n(hf(t(ids)).logits)
  got = model(jnp.asarray(ids))
  np.testing.assert_allclose(got, want, atol=1e-5)
  # Right padding: real positions are unchanged by the padded tail.
  real = np.ones((2, 11), bool)
  real[1, 7:] = False
  with torch.no_grad():
    padded = n(hf(t(ids), attention_mask=t(real.astype(np.int64))).logits)
  got = np.asarray(model(jnp.asarray(ids), jnp.asarray(real)))
  np.testing.assert_allclose(got[real], padded[real], atol=1e-5)


def test_gpt2_checkpoint_without_tied_head_loads():
  sd = {k: v for k, v in gpt2_reference().state_dict().items()
        if k != 'lm_head.weight'}
  model = tc.decoder_lm_from_gpt2(sd, GPT2)
  np.testing.assert_array_equal(model.embed.embedding[...],
                                n(sd['transformer.wte.weight']))


def test_bad_state_dicts_name_key_and_shapes():
  sd = tc.encoder_decoder_to_torch(jt.EncoderDecoder(SMALL))
  wrong = dict(sd)
  wrong['transformer.encoder.layers.1.linear1.weight'] = np.zeros((5, 16))
  with pytest.raises(ValueError) as err:
    tc.encoder_decoder_from_torch(wrong, SMALL)
  assert ("'transformer.encoder.layers.1.linear1.weight' has shape (5, 16) "
          'but the model expects (32, 16)') in str(err.value)

  missing = dict(sd)
  del missing['transformer.decoder.layers.0.norm3.bias']
  with pytest.raises(ValueError, match=r"missing key 'transformer.decoder."
                     r"layers.0.norm3.bias' \(expected shape \(16,\)\)"):
    tc.encoder_decoder_from_torch(missing, SMALL)

  extra = dict(sd, **{'transformer.encoder.layers.2.norm1.weight':
                      np.ones(16)})
  with pytest.raises(ValueError, match=r"unexpected key 'transformer.encoder"
                     r".layers.2.norm1.weight' with shape \(16,\)"):
    tc.encoder_decoder_from_torch(extra, SMALL)


def test_tied_config_refuses_a_different_head():
  sd = tc.encoder_decoder_to_torch(jt.EncoderDecoder(SMALL))
  sd['head.weight'] = sd['head.weight'] + 1.0
  with pytest.raises(ValueError, match='config ties them'):
    tc.encoder_decoder_from_torch(sd, SMALL)


def test_layouts_refuse_what_they_cannot_hold():
  with pytest.raises(ValueError, match='grouped-query'):
    tc.encoder_decoder_entries(SMALL.replace(num_kv_heads=2))
  with pytest.raises(ValueError, match=r"positional='rotary' \(GPT-2 has 'learned'\)"):
    tc.gpt2_entries(GPT2.replace(positional='rotary'))
