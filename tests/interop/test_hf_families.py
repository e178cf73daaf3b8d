"""Hugging Face decoder families both ways (interop/hf_families.py,
train/init_from.py, interop/hf_export.py): tiny random Llama 3 (GQA, RoPE
scaling), Llama 2 (attention biases), Mistral, Qwen2 (q/k/v biases) and
GPT-2 models made by transformers import with its logits, placed over eight
devices; exports load in transformers (AutoModelForCausalLM) with the JAX
model's logits; what the model cannot express is refused naming the field.
"""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from hf_models import FAMILIES, VOCAB, random_ids, save, torch_logits
from jax.sharding import NamedSharding

from jax_transformer.errors import UsageError
from jax_transformer.interop import hf_checkpoint, hf_export, hf_families
from jax_transformer.model import params as params_lib
from jax_transformer.model import sharding
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM
from jax_transformer.train import init_from

# float32 on both sides; logits reach about 5, where float32's spacing is
# 4.8e-7: 2e-5 is about 40 of those, as in test_init_from. Measured over
# eight devices with transformers 5.25: 5.7e-6 (Qwen2) to 1.1e-5 (Mistral).
TOLERANCE = 2e-5


def placed(folder, scan_layers=False, mesh_sizes=None):
  """(model config, params over 8 devices) of a Hugging Face folder."""
  source = init_from.open_source(folder)
  config = ModelConfig(**source.fields, dropout_rate=0.0,
                       attention_dropout_rate=0.0, scan_layers=scan_layers,
                       attention_implementation=None)
  mesh = sharding.make_mesh(mesh_sizes or {'data': 1, 'fsdp': 8,
                                           'tensor': 1})
  model_def, _ = params_lib.abstract(lambda: DecoderLM(config))
  specs = sharding.param_specs(model_def.logical_axes)
  shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
  return config, source.place(config, shardings), source


def jax_logits(config, params, ids):
  model_def, _ = params_lib.abstract(lambda: DecoderLM(config))
  logits = jax.jit(lambda p, x: model_def.merge(p)(x))(params, ids)
  return np.asarray(logits)


@pytest.fixture(scope='module', params=sorted(FAMILIES))
def hf_folder(request, tmp_path_factory):
  """(family, folder, torch model); Llama 3 in three shard files."""
  family = request.param
  folder = str(tmp_path_factory.mktemp('hf') / family)
  kwargs = {'max_shard_size': '40KB'} if family == 'llama3' else {}
  return family, folder, save(family, folder, seed=3, **kwargs)


def test_each_family_imports_with_transformers_logits(hf_folder):
  family, folder, model = hf_folder
  if family == 'llama3':
    assert os.path.exists(os.path.join(folder, hf_checkpoint.HF_INDEX))
  config, params, source = placed(folder, scan_layers=family == 'qwen2')
  assert len(next(iter(params.values())).sharding.device_set) == 8
  ids = random_ids()
  diff = np.abs(jax_logits(config, params, ids) - torch_logits(model, ids))
  assert diff.max() < TOLERANCE, (family, diff.max())
  tokenizer = source.tokenizer()
  assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (1, 2, 0)
  assert tokenizer.vocab_size == VOCAB


def test_each_family_exports_and_transformers_loads_it(hf_folder, tmp_path):
  family, folder, model = hf_folder
  config, params, source = placed(folder, scan_layers=family == 'llama2')
  out = str(tmp_path / 'export')
  hf_export.write_folder(config, params, source.tokenizer(), out,
                         max_shard_bytes=30_000)
  assert os.path.exists(os.path.join(out, hf_export.HF_INDEX))
  with open(os.path.join(out, 'config.json')) as f:
    written = json.load(f)
  want = {'llama3': 'llama', 'llama2': 'llama'}.get(family, family)
  if family == 'mistral':  # the same layout as Llama: written as Llama
    want = 'llama'
  assert written['model_type'] == want
  loaded = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32).eval()
  ids = random_ids(seed=1)
  got = torch_logits(loaded, ids)
  diff = np.abs(got - jax_logits(config, params, ids))
  assert diff.max() < TOLERANCE, (family, diff.max())
  # And it is the model transformers made, in the family's own class.
  assert np.abs(got - torch_logits(model, ids)).max() < TOLERANCE
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
  # Reading the export back gives the same fields.
  assert init_from.open_source(out).fields == source.fields


@pytest.fixture(scope='module')
def mistral_folder(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp('hf') / 'mistral')
  save('mistral', folder, seed=3)
  return folder


def test_mistral_exports_as_mistral_on_request(mistral_folder, tmp_path):
  folder = mistral_folder
  config, params, source = placed(folder)
  out = str(tmp_path / 'export')
  hf_export.write_folder(config, params, source.tokenizer(), out,
                         family='mistral')
  loaded = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32).eval()
  assert isinstance(loaded, transformers.MistralForCausalLM)
  ids = random_ids(seed=2)
  assert np.abs(torch_logits(loaded, ids)
                - jax_logits(config, params, ids)).max() < TOLERANCE


LLAMA = dict(model_type='llama', vocab_size=300, hidden_size=32,
             intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)


@pytest.mark.parametrize('changes, field', [
    (dict(model_type='mistral', sliding_window=64), 'sliding_window=64'),
    (dict(model_type='qwen2', use_sliding_window=True, sliding_window=32),
     'sliding_window=32'),
    (dict(rope_scaling={'rope_type': 'yarn', 'factor': 4.0}),
     "rope_type='yarn'"),
    (dict(rope_parameters={'rope_type': 'dynamic', 'rope_theta': 1e4}),
     "rope_type='dynamic'"),
    (dict(hidden_act='gelu'), "hidden_act='gelu'"),
    (dict(mlp_bias=True), 'mlp_bias=True'),
    (dict(head_dim=16), 'head_dim=16'),
    (dict(model_type='gemma'), "model_type='gemma'"),
])
def test_what_the_model_cannot_express_is_refused_naming_it(changes, field):
  with pytest.raises(UsageError) as e:
    hf_families.fields_of({**LLAMA, **changes}, 'x/config.json')
  message = str(e.value)
  assert field in message and 'x/config.json' in message, message
  assert message.count('.') <= 3 and '\n' not in message, message


def test_a_window_never_in_effect_imports():
  fields = hf_families.fields_of(
      {**LLAMA, 'model_type': 'mistral', 'sliding_window': 128})[1]
  assert fields['max_len'] == 128


def test_export_refuses_what_a_family_cannot_hold():
  gelu = ModelConfig(num_encoder_layers=0, positional='rotary',
                     norm='rmsnorm', norm_first=True, activation='gelu',
                     use_bias=False, scale_embeddings=False)
  with pytest.raises(UsageError, match="activation='gelu'"):
    hf_export.check_fits(gelu)
  with pytest.raises(UsageError, match="rope_scaling='llama3'"):
    hf_export.check_fits(gelu.replace(activation='swiglu',
                                      rope_scaling='llama3'), 'qwen2')


def test_bfloat16_files_read_tensor_by_tensor(tmp_path):
  folder = str(tmp_path / 'bf16')
  model = save('llama3', folder, seed=4)
  model.to(torch.bfloat16).save_pretrained(folder)
  files = hf_checkpoint.TensorFiles.of_folder(folder)
  key = 'model.layers.1.mlp.down_proj.weight'
  want = model.state_dict()[key].float().numpy()
  np.testing.assert_array_equal(files.get(key), want)
