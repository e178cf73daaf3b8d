"""The Pallas splash kernel (TPU attention) equals XLA's attention, run in
Pallas's interpreter on this host: outputs and gradients in float32, alone,
inside the models, and split over a mesh.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.model import attention, sharding, splash
from jax_transformer.model.masks import Mask, attention_args

B, T, H = 2, 256, 16
LENGTHS = np.array([T, 100])
# Two packed rows: segments of 100, 90 and 40 tokens, then padding (0).
SEGMENTS = np.stack([np.repeat([1, 2, 3, 0], [100, 90, 40, 26]),
                     np.repeat([1, 2, 0], [200, 50, 6])])

MASKS = {
    'causal': Mask(causal=True),
    'causal, right padded': Mask(causal=True, key_lengths=LENGTHS),
    'encoder, right padded': Mask(key_lengths=LENGTHS),
    'causal, packed': Mask(causal=True, query_segments=SEGMENTS,
                           key_segments=SEGMENTS),
    'encoder, packed': Mask(query_segments=SEGMENTS, key_segments=SEGMENTS),
}


def qkv(heads, kv_heads, seed=0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.normal(size=(B, T, n, H)), jnp.float32)
          for n in (heads, kv_heads, kv_heads)]


def real_queries(mask):
  """[B, T] bool: the queries whose outputs are used (not packing filler)."""
  if mask.key_segments is None:
    return np.ones((B, T), bool)
  return np.asarray(mask.key_segments) > 0


def xla(q, k, v, mask):
  return jax.nn.dot_product_attention(q, k, v, **attention_args(mask),
                                      implementation='xla')


def kernel(q, k, v, mask):
  return splash.attention(q, k, v, mask, interpret=True)


def loss_and_grads(attend, q, k, v, mask):
  """A loss over real queries only, as training's, and its gradients."""
  weights = jnp.asarray(real_queries(mask), jnp.float32)[:, :, None, None]
  target = jnp.sin(jnp.arange(q.size, dtype=jnp.float32)).reshape(q.shape)

  def loss(q, k, v):
    return jnp.sum(weights * (attend(q, k, v, mask) - target) ** 2)

  return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)


# Every mask with grouped-query heads; plain multi-head once (the rest of
# its cases in the full suite only).
CASES = ([(name, 4, 2) for name in MASKS if name != 'causal']
         + [pytest.param('causal', 4, 2, marks=pytest.mark.slow),
            ('causal', 4, 4)]
         + [pytest.param(name, 4, 4, marks=pytest.mark.slow)
            for name in MASKS if name != 'causal'])


@pytest.mark.parametrize('name,heads,kv_heads', CASES)
def test_the_kernel_equals_xla_outputs_and_gradients(name, heads, kv_heads):
  mask = MASKS[name]
  assert splash.takes(mask, T, T)
  q, k, v = qkv(heads, kv_heads)
  real = real_queries(mask)
  np.testing.assert_allclose(np.asarray(kernel(q, k, v, mask))[real],
                             np.asarray(xla(q, k, v, mask))[real],
                             rtol=1e-5, atol=1e-5)
  got, got_grads = loss_and_grads(kernel, q, k, v, mask)
  want, want_grads = loss_and_grads(xla, q, k, v, mask)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert np.abs(w).max() > 1e-2  # a real gradient, not zeros both sides


def test_an_empty_row_stays_finite():
  q, k, v = qkv(2, 2)
  mask = Mask(causal=True, key_lengths=np.array([0, 5]))
  assert np.isfinite(np.asarray(kernel(q, k, v, mask))).all()


@pytest.mark.parametrize('mask,queries,keys', [
    (Mask(causal=True), 200, 200),                  # not whole 128 blocks
    (Mask(key_lengths=LENGTHS), 128, 256),          # cross-attention
    (Mask(dense_part=np.ones((B, 1, T, T), bool)), T, T),
    (Mask(causal=True, key_lengths=LENGTHS, query_segments=SEGMENTS,
          key_segments=SEGMENTS), T, T),
])
def test_masks_the_kernel_cannot_take_stay_on_xla(mask, queries, keys):
  assert not splash.takes(mask, queries, keys)


def lm(implementation, num_kv_heads=None):
  config = jt.ModelConfig(
      vocab_size=64, d_model=64, num_heads=4, num_kv_heads=num_kv_heads,
      num_encoder_layers=0, num_decoder_layers=2, d_ff=128, dropout_rate=0.0,
      attention_dropout_rate=0.0, max_len=T, positional='rotary',
      attention_implementation=implementation)
  return jt.DecoderLM(config, rngs=nnx.Rngs(0))


def lm_loss_and_grads(model, ids, segments):
  weights = jnp.asarray(segments > 0, jnp.float32)

  def loss(model):
    logits = model(ids, segment_ids=segments)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]),
                               ids[:, 1:, None], axis=-1)[..., 0]
    return jnp.sum(nll * weights[:, 1:])

  return nnx.value_and_grad(loss)(model)


def assert_models_agree(got, want):
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for g, w in zip(jax.tree.leaves(nnx.state(got[1])),
                  jax.tree.leaves(nnx.state(want[1]))):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('kv_heads', [None, 2])
def test_a_packed_lm_step_equals_xla(kv_heads):
  ids = jnp.asarray(np.random.default_rng(1).integers(1, 64, (B, T)))
  segments = jnp.asarray(SEGMENTS)
  assert_models_agree(lm_loss_and_grads(lm('splash', kv_heads), ids, segments),
                      lm_loss_and_grads(lm('xla', kv_heads), ids, segments))


@pytest.mark.slow
def test_over_a_mesh_the_kernel_runs_per_shard_and_equals_xla():
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})
  ids = jnp.asarray(np.random.default_rng(2).integers(1, 64, (4, T)))
  segments = jnp.asarray(np.concatenate([SEGMENTS, SEGMENTS[::-1]]))
  step = jax.jit(lm_loss_and_grads)
  with jax.set_mesh(mesh):
    got = step(lm('splash'), ids, segments)
    text = jax.jit(lm_loss_and_grads).lower(lm('splash'), ids,
                                            segments).as_text()
  assert 'shard_map' in text or 'manual' in text
  assert_models_agree(got, lm_loss_and_grads(lm('xla'), ids, segments))


def test_auto_picks_the_kernel_when_compiling_for_a_tpu():
  config = lm('auto').config
  assert attention.implementation(config, jnp.float32) == 'xla'
  with attention.compiling_for('tpu'):
    assert attention.implementation(config, jnp.float32) == 'splash'
