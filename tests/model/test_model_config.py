import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.model.blocks import EncoderLayer


@pytest.mark.parametrize('changes, words', [
    (dict(d_model=510), 'not divisible by num_heads=8'),
    (dict(num_kv_heads=3), 'num_kv_heads=3 must be a positive divisor'),
    (dict(activation='tanh'), "activation='tanh' is not one of"),
    (dict(positional='alibi'), "positional='alibi'"),
    (dict(dropout_rate=1.0), 'dropout_rate must be in [0, 1)'),
    (dict(vocab_size=0), 'vocab_size must be an integer >= 1'),
    (dict(dtype='int8'), "dtype='int8' is not one of"),
    (dict(num_encoder_layers=-1), 'num_encoder_layers must be'),
    (dict(attention_implementation='cudnn'), "needs dtype 'bfloat16'"),
])
def test_bad_values_name_the_field(changes, words):
  with pytest.raises(ValueError) as err:
    jt.ModelConfig(**changes)
  assert words in str(err.value)
  assert str(err.value).count('\n') == 0


def test_base_parameter_counts_match_the_paper():
  config = jt.transformer_base()
  layer = nnx.eval_shape(lambda: EncoderLayer(config, nnx.Rngs(0)))
  assert jt.count_params(layer) == 3_152_384
  model = nnx.eval_shape(lambda: jt.EncoderDecoder(config))
  assert jt.count_params(model) == 63_084_544


def test_untied_base_adds_an_output_projection():
  model = nnx.eval_shape(
      lambda: jt.EncoderDecoder(jt.transformer_base(tie_embeddings=False)))
  assert jt.count_params(model) == 63_084_544 + 512 * 37000


def test_big_and_gpt2_presets():
  big = nnx.eval_shape(lambda: jt.EncoderDecoder(jt.transformer_big()))
  # 6 encoder layers of 12,596,224, 6 decoder layers of 16,796,672, two
  # final norms of 2,048 and a 37000 x 1024 embedding.
  assert jt.count_params(big) == 6 * 12_596_224 + 6 * 16_796_672 + 4_096 + (
      37_000 * 1_024)
  gpt2 = nnx.eval_shape(lambda: jt.DecoderLM(jt.gpt2_small()))
  assert jt.count_params(gpt2) == 124_439_808


def test_presets_accept_overrides():
  assert jt.PRESETS['transformer_base'](vocab_size=100).vocab_size == 100
  assert jt.gpt2_small(num_decoder_layers=2).norm_first
