"""Model invariants: packing, positions, cached decoding, dtypes."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.model.models import default_positions

# One xdist worker for the module: its models run eagerly, and each op a
# worker meets first compiles there; spread over both workers the module's
# tests paid those compiles twice (its durations: a case as cheap as
# another ran several times longer on the other worker).
pytestmark = pytest.mark.xdist_group('models')

LM = jt.ModelConfig(vocab_size=53, d_model=32, num_heads=4, num_kv_heads=2,
                    d_ff=64, num_encoder_layers=0, num_decoder_layers=2,
                    norm_first=True, positional='rotary', activation='swiglu',
                    norm='rmsnorm', use_bias=False, scale_embeddings=False,
                    max_len=64)
ED = jt.ModelConfig(vocab_size=53, d_model=32, num_heads=4, d_ff=64,
                    num_encoder_layers=2, num_decoder_layers=2)


def test_default_positions_restart_per_segment_and_skip_padding():
  seg = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0]])
  np.testing.assert_array_equal(default_positions(seg, None, seg),
                                [[0, 1, 2, 0, 1, 0, 0, 1]])
  mask = jnp.array([[False, False, True, True]])
  np.testing.assert_array_equal(default_positions(mask, mask), [[0, 0, 0, 1]])


@pytest.mark.slow
@pytest.mark.parametrize('positional', ['rotary', 'learned', 'sinusoidal'])
def test_packed_lm_equals_each_sequence_alone(positional):
  model = jt.DecoderLM(LM.replace(positional=positional), nnx.Rngs(0))
  rs = np.random.RandomState(0)
  a, b = rs.randint(1, 53, 5), rs.randint(1, 53, 4)
  packed = jnp.asarray(np.concatenate([a, b, [0, 0]]))[None]
  seg = jnp.array([[1] * 5 + [2] * 4 + [0, 0]])
  out = model(packed, segment_ids=seg)
  np.testing.assert_allclose(out[0, :5], model(jnp.asarray(a)[None])[0],
                             atol=1e-5)
  np.testing.assert_allclose(out[0, 5:9], model(jnp.asarray(b)[None])[0],
                             atol=1e-5)


@pytest.mark.slow
def test_packed_encoder_decoder_equals_each_pair_alone():
  model = jt.EncoderDecoder(ED, nnx.Rngs(0))
  rs = np.random.RandomState(1)
  s1, s2, t1, t2 = (rs.randint(1, 53, k) for k in (4, 6, 3, 5))
  src = jnp.asarray(np.concatenate([s1, s2]))[None]
  tgt = jnp.asarray(np.concatenate([t1, t2, [0]]))[None]
  src_seg = jnp.array([[1] * 4 + [2] * 6])
  tgt_seg = jnp.array([[1] * 3 + [2] * 5 + [0]])
  out = model(src, tgt, src_segment_ids=src_seg, tgt_segment_ids=tgt_seg)
  alone1 = model(jnp.asarray(s1)[None], jnp.asarray(t1)[None])
  alone2 = model(jnp.asarray(s2)[None], jnp.asarray(t2)[None])
  np.testing.assert_allclose(out[0, :3], alone1[0], atol=1e-5)
  np.testing.assert_allclose(out[0, 3:8], alone2[0], atol=1e-5)


@pytest.mark.parametrize('norm_first', [
    pytest.param(False, marks=pytest.mark.slow), True])
def test_lm_prefill_and_steps_equal_the_full_forward(norm_first):
  model = jt.DecoderLM(LM.replace(norm_first=norm_first), nnx.Rngs(2))
  ids = jnp.asarray(np.random.RandomState(0).randint(1, 53, (2, 9)))
  full = model(ids)
  cache = model.init_cache(2, 16)
  logits, cache = model.extend(ids[:, :5], cache)
  steps = [logits]
  for i in range(5, 9):
    logits, cache = model.extend(ids[:, i:i + 1], cache)
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-5)
  assert int(cache.index) == 9


@pytest.mark.parametrize('norm_first', [
    pytest.param(False, marks=pytest.mark.slow), True])
def test_encoder_decoder_cached_steps_equal_the_full_forward(norm_first):
  model = jt.EncoderDecoder(ED.replace(norm_first=norm_first), nnx.Rngs(3))
  rs = np.random.RandomState(0)
  src, tgt = jnp.asarray(rs.randint(1, 53, (2, 7))), jnp.asarray(
      rs.randint(1, 53, (2, 6)))
  src_mask = jnp.array([[True] * 7, [True] * 5 + [False] * 2])
  full = model(src, tgt, src_mask)
  cache = model.init_cache(model.encode(src, src_mask), src_mask, 8)
  logits, cache = model.extend(tgt[:, :2], cache)
  steps = [logits]
  for i in range(2, 6):
    logits, cache = model.extend(tgt[:, i:i + 1], cache)
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.slow
def test_right_padded_prompts_continue_at_their_own_positions():
  """A short prompt's padding slots are skipped by later tokens."""
  model = jt.DecoderLM(LM, nnx.Rngs(4))
  short, long = [5, 6, 7], [8, 9, 10, 11, 12]
  prompts = jnp.array([short + [0, 0], long])
  mask = jnp.array([[True] * 3 + [False] * 2, [True] * 5])
  cache = model.init_cache(2, 8)
  _, cache = model.extend(prompts, cache, mask)
  nxt = jnp.array([[20], [21]])
  step, _ = model.extend(nxt, cache)
  np.testing.assert_allclose(step[0, 0], model(jnp.array([short + [20]]))[0, -1],
                             atol=1e-5)
  np.testing.assert_allclose(step[1, 0], model(jnp.array([long + [21]]))[0, -1],
                             atol=1e-5)


def test_bfloat16_compute_keeps_float32_params_and_logits():
  model = jt.DecoderLM(LM.replace(dtype='bfloat16'), nnx.Rngs(0))
  ids = jnp.ones((1, 4), jnp.int32)
  out = model(ids)
  assert out.dtype == jnp.float32
  assert model.embed.embedding[...].dtype == jnp.float32
  ref = jt.DecoderLM(LM, nnx.Rngs(0))(ids)
  np.testing.assert_allclose(out, ref, atol=0.1)


def test_training_mode_uses_dropout_deterministically_per_key():
  model = jt.EncoderDecoder(ED, nnx.Rngs(0))
  src = tgt = jnp.ones((1, 5), jnp.int32)
  a = model(src, tgt, deterministic=False, rngs=nnx.Rngs(dropout=1))
  b = model(src, tgt, deterministic=False, rngs=nnx.Rngs(dropout=1))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, model(src, tgt), atol=1e-3)


def test_every_parameter_has_logical_axes():
  from jax_transformer.model.sharding import DEFAULT_RULES
  for model in (jt.EncoderDecoder(ED.replace(tie_embeddings=False)),
                jt.DecoderLM(LM.replace(positional='learned'))):
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
      axes = var.get_metadata()['out_sharding']
      assert len(axes) == var[...].ndim, path
      assert set(axes) <= set(DEFAULT_RULES), path


def test_packed_encoder_decoder_needs_both_segment_ids():
  model = jt.EncoderDecoder(ED)
  ids = jnp.ones((1, 4), jnp.int32)
  with pytest.raises(ValueError, match='both src_segment_ids and'):
    model(ids, ids, src_segment_ids=jnp.ones((1, 4), jnp.int32))
