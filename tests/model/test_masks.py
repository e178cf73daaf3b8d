"""Masks as structure give the same numerics as the dense masks they replace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer.model import attention as attn
from jax_transformer.model import masks
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM, EncoderDecoder
from jax_transformer.train import steps

# One xdist worker for the module: its models run eagerly, and each op a
# worker meets first compiles there; spread over both workers the module's
# tests paid those compiles twice (its durations: a case as cheap as
# another ran several times longer on the other worker).
pytestmark = pytest.mark.xdist_group('masks')

B, T, S, D, N, V = 3, 6, 5, 16, 4, 40
LENGTHS = np.array([6, 3, 1])
CONFIG = ModelConfig(vocab_size=V, d_model=D, num_heads=N, num_kv_heads=2,
                     d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
                     attention_implementation='xla')


def _segments(length):
  """Packed rows: [1 1 2 2 2 0 ...], [1 2 3 0 ...], [1 0 ...]."""
  rows = [[1, 1, 2, 2, 2, 0], [1, 2, 3, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
  return jnp.asarray([r[:length] for r in rows])


MASKS = {
    'causal': lambda: masks.Mask(causal=True),
    'causal + lengths': lambda: masks.Mask(
        causal=True, key_lengths=jnp.asarray(LENGTHS)),
    'lengths (cross)': lambda: masks.Mask(key_lengths=jnp.asarray([5, 2, 1])),
    'packed causal': lambda: masks.Mask(
        causal=True, query_segments=_segments(T), key_segments=_segments(T)),
    'packed cross': lambda: masks.Mask(
        query_segments=_segments(T), key_segments=_segments(S)),
    'dense (cache slots)': lambda: masks.Mask(dense_part=masks.combine(
        masks.causal_mask(jnp.arange(T) + 1, jnp.arange(8)),
        masks.padding_mask(jnp.arange(8)[None] < jnp.asarray([[7], [4], [2]])))),
}
KEYS = {'causal': T, 'causal + lengths': T, 'lengths (cross)': S,
        'packed causal': T, 'packed cross': S, 'dense (cache slots)': 8}


@pytest.mark.parametrize('kind', sorted(MASKS))
def test_structured_mask_equals_its_dense_form(kind):
  """Output and gradients through Attention.attend, structure vs dense."""
  layer = attn.Attention(CONFIG, nnx.Rngs(0), rotary=False)
  rng = np.random.RandomState(1)
  q = jnp.asarray(rng.randn(B, T, N, D // N), jnp.float32)
  k, v = (jnp.asarray(rng.randn(B, KEYS[kind], 2, D // N), jnp.float32)
          for _ in range(2))
  structured = MASKS[kind]()
  dense = masks.Mask(dense_part=structured.dense(T, KEYS[kind]))

  def run(mask):
    return jax.value_and_grad(
        lambda q, k, v: jnp.sum(jnp.sin(layer.attend(q, k, v, mask))),
        argnums=(0, 1, 2))(q, k, v)

  (got, grads), (want, want_grads) = run(structured), run(dense)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for g, w in zip(grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_lengths_and_causality_reach_the_kernel_as_arguments():
  """A fused kernel gets is_causal and lengths, and no mask to read."""
  args = masks.attention_args(masks.Mask(causal=True,
                                         key_lengths=jnp.asarray(LENGTHS)))
  assert args['mask'] is None and args['is_causal']
  assert args['key_value_seq_lengths'].dtype == jnp.int32
  packed = masks.attention_args(MASKS['packed causal']())
  assert packed['mask'].shape == (B, 1, T, T)


def _ids(length, seed=0):
  return jnp.asarray(np.random.RandomState(seed).randint(3, V, (B, length)))


def test_decoder_lm_lengths_equal_bool_mask_and_segments():
  model = DecoderLM(CONFIG, nnx.Rngs(0))
  ids = _ids(T)
  real = jnp.arange(T)[None] < jnp.asarray(LENGTHS)[:, None]
  by_lengths = model(ids, jnp.asarray(LENGTHS))
  by_bool = model(ids, real)
  by_segments = model(ids, segment_ids=real.astype(jnp.int32))
  np.testing.assert_allclose(by_lengths, by_bool, rtol=1e-6, atol=1e-6)
  # Segments block padding queries entirely (their outputs differ and are
  # never used); real tokens agree.
  np.testing.assert_allclose(by_lengths[real], by_segments[real], rtol=1e-6,
                             atol=1e-6)


def test_encoder_decoder_lengths_equal_bool_masks():
  model = EncoderDecoder(CONFIG, nnx.Rngs(0))
  src, tgt = _ids(S, 1), _ids(T, 2)
  src_len, tgt_len = jnp.asarray([5, 2, 1]), jnp.asarray(LENGTHS)
  real = lambda n, t: jnp.arange(t)[None] < n[:, None]
  np.testing.assert_allclose(
      model(src, tgt, src_len, tgt_len),
      model(src, tgt, real(src_len, S), real(tgt_len, T)),
      rtol=1e-6, atol=1e-6)


def test_cached_extend_equals_structured_forward():
  """The cache path (dense slots) and the training path (causal + lengths)
  give the same logits on a right-padded prompt's real tokens."""
  model = DecoderLM(CONFIG, nnx.Rngs(0))
  ids = _ids(T)
  real = jnp.arange(T)[None] < jnp.asarray(LENGTHS)[:, None]
  cached, _ = model.extend(ids, model.init_cache(B, 8), real)
  full = model(ids, jnp.asarray(LENGTHS))
  for row, n in enumerate(LENGTHS):
    np.testing.assert_allclose(cached[row, :n], full[row, :n], rtol=1e-5,
                               atol=1e-5)


def _unpacked_batch(kind):
  seg = (jnp.arange(T)[None] < jnp.asarray(LENGTHS)[:, None]).astype(jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(T), (B, T)) * seg
  if kind == 'lm':
    return {'inputs': _ids(T), 'targets': _ids(T, 5), 'segment_ids': seg,
            'positions': pos}
  # The last row is an eval batch's empty filler: no source, no target.
  src_seg = (jnp.arange(S)[None] < jnp.asarray([[5], [2], [0]])).astype(
      jnp.int32)
  seg = seg.at[2].set(0)
  pos = pos * seg
  return {'src': _ids(S, 1), 'src_segment_ids': src_seg,
          'src_positions': jnp.broadcast_to(jnp.arange(S), (B, S)) * src_seg,
          'tgt_in': _ids(T, 2), 'tgt_out': _ids(T, 3),
          'tgt_segment_ids': seg, 'tgt_positions': pos}


@pytest.mark.parametrize('kind', [
    'lm', pytest.param('translation', marks=pytest.mark.slow)])
def test_unpacked_step_loss_and_gradients_equal_the_segment_path(kind):
  """packed=False (lengths) and packed=True (segments) on the batcher's
  unpacked rows: same loss sums and gradients."""
  cls = DecoderLM if kind == 'lm' else EncoderDecoder
  model = cls(CONFIG.replace(dropout_rate=0.0), nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  batch = _unpacked_batch(kind)

  def loss(state, packed):
    sums = steps.loss_sums(nnx.merge(graphdef, state), batch, True,
                           packed=packed, label_smoothing=0.1)
    return sums['loss'], sums

  (got, got_sums), got_g = jax.value_and_grad(loss, has_aux=True)(state,
                                                                 False)
  (want, want_sums), want_g = jax.value_and_grad(loss, has_aux=True)(state,
                                                                    True)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(got_sums['nll'], want_sums['nll'], rtol=1e-6)
  for g, w in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('backend,dtype,heads,want', [
    ('cpu', 'bfloat16', 4, 'xla'),
    ('tpu', 'bfloat16', 4, 'splash'),   # the Pallas kernel
    ('tpu', 'float32', 4, 'splash'),
    ('gpu', 'bfloat16', 4, 'cudnn'),
    ('gpu', 'float16', 4, 'cudnn'),
    ('gpu', 'float32', 4, 'xla'),       # cuDNN attention has no float32
    ('gpu', 'bfloat16', 1, 'xla'),      # head width 256 > 128
])
def test_auto_picks_a_fused_kernel_only_where_it_runs(monkeypatch, backend, dtype,
                                             heads, want):
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  config = ModelConfig(d_model=256, num_heads=heads, dtype=dtype)
  assert attn.implementation(config, jnp.dtype(dtype)) == want
  assert attn.implementation(config.replace(attention_implementation='xla'),
                             jnp.dtype(dtype)) == 'xla'
