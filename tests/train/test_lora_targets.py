"""config.lora.targets: Hugging Face module names as aliases of the kernels
they load into, and the refusal of a name that matches nothing."""

import pytest
from flax import nnx

from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.model import lora
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM
from jax_transformer.model.params import abstract

GPT2 = dict(activation='gelu_tanh', positional='learned')
LLAMA = dict(activation='swiglu', norm='rmsnorm', positional='rotary',
             num_kv_heads=1, tie_embeddings=False, use_bias=False)


def kernels(targets, **fields):
  """The last names of the kernels targets adapts in a 2-layer LM."""
  config = ModelConfig(vocab_size=40, d_model=16, num_heads=2, d_ff=24,
                       max_len=16, num_encoder_layers=0,
                       num_decoder_layers=2, **fields)
  model_def, shapes = abstract(lambda: DecoderLM(config, nnx.Rngs(0)))
  found = lora.find_targets({k: v.shape for k, v in shapes.items()},
                            model_def.logical_axes, targets)
  assert {t.kernel.split('.')[1] for t in found} == {'0', '1'}
  return sorted({t.kernel.rsplit('.', 1)[-1] for t in found})


@pytest.mark.parametrize('targets, fields, want', [
    ('q_proj,k_proj,v_proj,o_proj', LLAMA, ['key', 'out', 'query', 'value']),
    ('gate_proj,up_proj,down_proj', LLAMA, ['wi', 'wi_gate', 'wo']),
    ('q_proj,v_proj', GPT2, ['query', 'value']),
    ('c_attn', GPT2, ['key', 'query', 'value']),
    # GPT-2's c_proj is the attention's output and the MLP's, as PEFT
    # matches it.
    ('c_proj', GPT2, ['out', 'wo']),
    ('c_fc', GPT2, ['wi']),
    ('c_attn,query', GPT2, ['key', 'query', 'value']),
])
def test_hugging_face_module_names_name_the_kernels_they_load_into(
    targets, fields, want):
  assert kernels(targets, **fields) == want


@pytest.mark.parametrize('targets, fields, match', [
    ('q_prj', LLAMA, "'q_prj' matches no parameter of this model; did you "
                     'mean q_proj'),
    ('quey', GPT2, 'did you mean query'),
    # GPT-2 has no gate: the alias names nothing there.
    ('gate_proj', GPT2, "'gate_proj' matches no parameter"),
])
def test_an_unknown_target_is_refused_naming_the_closest(targets, fields,
                                                         match):
  with pytest.raises(UsageError, match=match) as e:
    kernels(targets, **fields)
  assert '\n' not in str(e.value)
  assert 'its kernels are' in str(e.value)


@pytest.mark.parametrize('dropout', [-0.1, 1.0, 'x', True])
def test_lora_dropout_outside_0_1_is_refused_in_one_sentence(dropout):
  exp = Experiment.of({'init_from': '/somewhere',
                       'lora': {'rank': 4, 'dropout': dropout}})
  with pytest.raises(UsageError, match='config.lora.dropout must be') as e:
    exp.check()
  assert '\n' not in str(e.value)


def test_lora_dropout_defaults_to_none():
  assert Experiment.of({}).lora.dropout == 0.0
  Experiment.of({'init_from': '/somewhere',
                 'lora': {'rank': 4, 'dropout': 0.1}}).check()
