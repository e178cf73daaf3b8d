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

# One xdist worker for the module: its programs compile once, not once
# on each worker (one process ran it in about two thirds of its
# durations).
pytestmark = pytest.mark.xdist_group('splash')


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


# The two paths add the same float32 terms in different orders, so they
# agree to rounding, and rounding in a sum is relative to the size of its
# terms, not of its result: an element where terms cancel can be off by
# many times its own relative precision while both paths are right (the
# mesh test's elementwise rtol=1e-5 failed on 2 of 4096 such elements in
# CI). The kernel walks keys in blocks with an online softmax (a running
# max and sum, rescaled at each block) where XLA takes one softmax over all
# keys, and gradients sum over queries and heads, and over the mesh's
# shards, in orders of their own. A float32 sum of n terms in any order is
# off by at most about n * eps times the sum of the terms' magnitudes;
# here the terms are of the size of the results (softmax weights <= 1
# times values), so each array is held to
#     max |got - want| <= n * eps32 * max |want|,
# n the longest sum behind it. Measured: at most 8 eps32 * max |want|
# (about sqrt(n)/2, as rounding errors add at random). A wrong mask, head
# or shard moves values by a good part of their scale: 1e6 and more.
EPS32 = float(np.finfo(np.float32).eps)


def assert_sums_agree(got, want, terms, what='values'):
  """got equals want to float32 rounding of sums of `terms` terms."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape, (got.shape, want.shape)
  scale = np.abs(want).max()
  error = np.abs(got - want).max()
  assert error <= terms * EPS32 * scale, (
      f'{what}: off by {error:.3g} = {error / (EPS32 * scale):.3g} eps32 x '
      f'the largest value {scale:.3g}; sums of {terms} terms allow {terms}.')


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
  # Outputs: sums over T keys; q's gradient too; k's and v's over T
  # queries of each of the query heads that share them; the loss over
  # every output.
  groups = heads // kv_heads
  assert_sums_agree(np.asarray(kernel(q, k, v, mask))[real],
                    np.asarray(xla(q, k, v, mask))[real], T, 'outputs')
  got, got_grads = loss_and_grads(kernel, q, k, v, mask)
  want, want_grads = loss_and_grads(xla, q, k, v, mask)
  assert_sums_agree(got, want, q.size, 'loss')
  for name, g, w, terms in zip('qkv', got_grads, want_grads,
                               (T, T * groups, T * groups)):
    assert_sums_agree(g, w, terms, f'gradient of {name}')
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


def assert_models_agree(got, want, tokens):
  """Loss and parameter gradients of lm_loss_and_grads agree; every one is
  a sum over the batch's tokens (see assert_sums_agree)."""
  assert_sums_agree(got[0], want[0], tokens, 'loss')
  got_leaves = jax.tree.leaves_with_path(nnx.state(got[1]))
  want_leaves = jax.tree.leaves(nnx.state(want[1]))
  assert len(got_leaves) == len(want_leaves)
  for (path, g), w in zip(got_leaves, want_leaves):
    assert_sums_agree(g, w, tokens, jax.tree_util.keystr(path))


@pytest.mark.slow
@pytest.mark.parametrize('kv_heads', [None, 2])
def test_a_packed_lm_step_equals_xla(kv_heads):
  ids = jnp.asarray(np.random.default_rng(1).integers(1, 64, (B, T)))
  segments = jnp.asarray(SEGMENTS)
  assert_models_agree(lm_loss_and_grads(lm('splash', kv_heads), ids, segments),
                      lm_loss_and_grads(lm('xla', kv_heads), ids, segments),
                      ids.size)


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
  assert_models_agree(got, lm_loss_and_grads(lm('xla'), ids, segments),
                      ids.size)


def test_auto_picks_the_kernel_when_compiling_for_a_tpu():
  config = lm('auto').config
  assert attention.implementation(config, jnp.float32) == 'xla'
  with attention.compiling_for('tpu'):
    assert attention.implementation(config, jnp.float32) == 'splash'
