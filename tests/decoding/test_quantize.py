"""jax_transformer.decoding.quantize: int8 kernels within half a step of
the floats,
exactly the matmul kernels quantized, bfloat16 copies, both composed.

Decoding with these copies (tokens against float32) is in
test_decoding_dtype.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.decoding import quantize
from jax_transformer.decoding.quantize import Int8Kernel

# One xdist worker for the module: its models' ops and steps compile
# once, not once on each worker (one process ran it in about half its
# durations).
pytestmark = pytest.mark.xdist_group('quantize')


LM = jt.ModelConfig(vocab_size=64, d_model=64, num_heads=4, num_kv_heads=2,
                    d_ff=128, num_encoder_layers=0, num_decoder_layers=2,
                    norm_first=True, positional='rotary', activation='swiglu',
                    norm='rmsnorm', use_bias=False, scale_embeddings=False,
                    tie_embeddings=False)
ED = jt.ModelConfig(vocab_size=64, d_model=32, num_heads=4, d_ff=64,
                    num_encoder_layers=1, num_decoder_layers=2)
IDS = jax.random.randint(jax.random.key(1), (4, 12), 3, 64)
ATTENTION = {'query', 'key', 'value', 'out'}


def flat(model):
  return {'.'.join(map(str, path)): variable.get_value()
          for path, variable in nnx.to_flat_state(nnx.state(model))}


def test_int8_rounds_each_channel_to_within_half_its_scale():
  w = jax.random.normal(jax.random.key(0), (2, 32, 4, 8))  # [L, D, N, H]
  w = w.at[1, :, 2, 5].set(0.0)                            # a dead channel
  q = Int8Kernel.quantize(w, (1,))
  assert q.values.dtype == jnp.int8 and q.scale.dtype == jnp.float32
  assert q.scale.shape == (2, 1, 4, 8) and q.shape == w.shape
  values = np.asarray(q.values, np.int32)
  assert values.min() >= -127 and values.max() <= 127
  # Each channel's largest entry lands on +-127: the full range is used.
  np.testing.assert_array_equal(np.abs(values).max(axis=1)[0], 127)
  error = np.abs(np.asarray(q[...]) - np.asarray(w))
  scale = np.asarray(q.scale)
  assert (error <= scale / 2 * (1 + 1e-6)).all()
  assert error.max() > scale.min() / 8                     # not exact
  np.testing.assert_array_equal(q[...][1, :, 2, 5], 0.0)
  assert np.isfinite(scale).all()


def test_int8_quantizes_exactly_the_matmul_kernels():
  for model, kernels in (
      (jt.DecoderLM(LM), ATTENTION | {'wi', 'wi_gate', 'wo', 'head'}),
      (jt.EncoderDecoder(ED), ATTENTION | {'wi', 'wo'})):  # tied: no head
    before, after = flat(model), flat(quantize.int8(model))
    assert before.keys() == after.keys()
    quantized = {name for name, v in after.items()
                 if isinstance(v, Int8Kernel)}
    assert {name.split('.')[-1] for name in quantized} == kernels
    for name, value in after.items():
      if name not in quantized:   # embeddings, norms, biases: untouched
        assert value is before[name]
    if isinstance(model, jt.EncoderDecoder):
      assert 'decoder_layers.0.cross_attn.out' in quantized


def test_scales_are_per_output_channel_in_both_layer_layouts():
  for scanned in (False, True):
    model = quantize.int8(jt.DecoderLM(LM.replace(scan_layers=scanned)))
    layer = model.layers if scanned else model.layers[0]
    lead = (2,) if scanned else ()
    shapes = {name: getattr(part, name).get_value().scale.shape
              for part, names in ((layer.self_attn, ('query', 'key', 'out')),
                                  (layer.ff, ('wi', 'wo')))
              for name in names}
    assert shapes == {'query': lead + (1, 4, 16), 'key': lead + (1, 2, 16),
                      'out': lead + (1, 1, 64), 'wi': lead + (1, 128),
                      'wo': lead + (1, 64)}


def test_int8_weighs_a_quarter_and_its_forward_stays_close():
  model = jt.DecoderLM(LM)
  q = quantize.int8(model)
  kernel_bytes = lambda m: sum(  # noqa: E731
      x.nbytes for name, v in flat(m).items()
      if name.split('.')[-1] in quantize.CONTRACTED
      for x in jax.tree.leaves(v))
  ratio = kernel_bytes(q) / kernel_bytes(model)
  assert 0.25 < ratio < 0.27   # int8 values plus one scale per channel
  want, got = model(IDS), q(IDS)
  assert got.dtype == jnp.float32
  # Measured 0.05 of the logits' spread on this random model.
  assert float(jnp.abs(got - want).max()) < 0.15 * float(want.std())


def test_bfloat16_copy_casts_floats_once_and_leaves_the_original():
  model = jt.DecoderLM(LM)
  copy = quantize.cast(model, 'bfloat16')
  assert (copy.config.dtype, copy.config.param_dtype) == ('bfloat16',) * 2
  assert copy.layers[0].ff.config is copy.config
  assert {v.dtype for v in flat(copy).values()} == {jnp.dtype('bfloat16')}
  assert model.config == LM
  assert {v.dtype for v in flat(model).values()} == {jnp.dtype('float32')}
  want, got = model(IDS), copy(IDS)
  assert got.dtype == jnp.float32   # logits stay float32
  assert float(jnp.abs(got - want).max()) < 0.15 * float(want.std())


def test_for_decoding_composes_and_returns_the_model_when_nothing_changes():
  model = jt.DecoderLM(LM)
  assert quantize.for_decoding(model) is model
  assert quantize.for_decoding(model, 'float32') is model
  both = quantize.for_decoding(model, 'bfloat16', 'int8')
  values = flat(both)
  wi = values['layers.0.ff.wi']
  # Quantized from the float32 weights; the scales stay float32.
  assert isinstance(wi, Int8Kernel) and wi.scale.dtype == jnp.float32
  np.testing.assert_array_equal(wi.values,
                                flat(quantize.int8(model))[
                                    'layers.0.ff.wi'].values)
  assert values['embed.embedding'].dtype == jnp.bfloat16
  again = flat(quantize.for_decoding(both, 'bfloat16', 'int8'))
  assert again['layers.0.ff.wi'].values is wi.values   # not requantized


@pytest.mark.parametrize('dtype,weights,fragment', [
    ('float16', None, 'dtype must be None or one of'),
    (None, 'int4', 'weights must be None or one of'),
])
def test_unknown_names_are_one_sentence(dtype, weights, fragment):
  with pytest.raises(ValueError, match=fragment):
    quantize.for_decoding(jt.DecoderLM(LM), dtype, weights)
