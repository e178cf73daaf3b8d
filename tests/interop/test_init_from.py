"""config.init_from (train/init_from.py) and import_params.py --from a
Hugging Face folder: the model fields come from the checkpoint, a
conflicting command-line override is refused, and a run starts from the
checkpoint's parameters and tokenizer."""

import importlib.util
import json
import os

import numpy as np
import pytest
import repo
from hf_models import VOCAB, random_ids, save, torch_logits

from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.train import init_from, trainer
from jax_transformer.workdirs import exporter as export_lib
from jax_transformer.workdirs import restore

LM = os.path.join(repo.ROOT, 'configs/lm_shakespeare.py:tiny')
GPT2 = os.path.join(repo.ROOT, 'configs/gpt2_small.py:shakespeare')
# float32 on both sides, logits up to ~3: rotary angles at theta 5e5 round
# differently in the two frameworks (measured up to 1.2e-5 here).
TOLERANCE = 2e-5


def resolved(cfg, explicit):
  """cfg with config.init_from's model fields (the trainer's check)."""
  return init_from.resolve_model(Experiment.of(cfg), explicit=explicit)[0]


def load_script(name):
  spec = importlib.util.spec_from_file_location(
      f'{name}_script', os.path.join(repo.ROOT, 'scripts', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


IMPORT = load_script('import_params')


@pytest.fixture(scope='module')
def llama_dir(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp('hf') / 'llama3')
  return folder, save('llama3', folder, seed=5)


def test_model_fields_come_from_the_checkpoint(llama_dir):
  folder, _ = llama_dir
  cfg = IMPORT.load_config(GPT2, [f'--config.init_from={folder}',
                                  '--config.model.dropout_rate=0.0'])
  cfg = resolved(cfg, explicit={'init_from',
                                                 'model.dropout_rate'})
  m = cfg.model
  assert (m.d_model, m.num_heads, m.num_kv_heads, m.num_decoder_layers,
          m.d_ff, m.vocab_size) == (32, 4, 2, 2, 64, VOCAB)
  assert (m.activation, m.norm, m.positional, m.use_bias, m.rope_scaling,
          m.rope_base) == ('swiglu', 'rmsnorm', 'rotary', False, 'llama3',
                           500000.0)
  assert m.dropout_rate == 0.0 and m.dtype == 'bfloat16'  # runtime: ours


def test_a_conflicting_override_is_refused_in_one_sentence(llama_dir):
  folder, _ = llama_dir
  cfg = IMPORT.load_config(LM, [f'--config.init_from={folder}',
                                '--config.model.d_model=64'])
  with pytest.raises(UsageError) as e:
    resolved(cfg, explicit={'model.d_model'})
  message = str(e.value)
  assert 'd_model=32' in message and '--config.model.d_model' in message
  assert '\n' not in message
  # The same value given explicitly is no conflict.
  cfg = IMPORT.load_config(LM, [f'--config.init_from={folder}',
                                '--config.model.d_model=32'])
  resolved(cfg, explicit={'model.d_model'})
  with pytest.raises(UsageError, match='neither a Hugging Face model'):
    resolved(IMPORT.load_config(
        LM, ['--config.init_from=/nonexistent/folder']), explicit=set())


def test_import_params_takes_every_field_from_config_json(
    capsys, tmp_path, llama_dir, fake_data_dir):
  folder, model = llama_dir
  work = str(tmp_path / 'w')
  # gpt2_small names learned positions and LayerNorm: the folder wins.
  assert IMPORT.main(['--from', folder, '--config', GPT2, '--workdir', work,
                      f'--config.data.data_dir={fake_data_dir}',
                      '--config.model.dtype=float32',
                      '--config.seq_len=32']) == 0
  out = capsys.readouterr().out
  assert f'--config.init_from={folder}' in out
  trained = restore.load_model(work)
  assert trained.model.config.norm == 'rmsnorm'
  assert trained.tokenizer.vocab_size == VOCAB
  ids = random_ids(seed=3)
  logits = export_lib.logits_fn(trained.model)(
      {'ids': ids, 'mask': np.ones(ids.shape, bool)})
  assert np.abs(logits - torch_logits(model, ids)).max() < TOLERANCE
  # A conflicting explicit field is refused.
  code = IMPORT.main(['--from', folder, '--config', GPT2, '--workdir',
                      str(tmp_path / 'w2'), '--config.model.d_ff=128'])
  assert code == 2
  assert '--config.model.d_ff' in capsys.readouterr().err


@pytest.mark.slow
def test_init_from_a_hugging_face_llama_trains_and_resumes(
    capsys, tmp_path, llama_dir, fake_data_dir):
  folder, model = llama_dir
  workdir = str(tmp_path / 'tune')
  flags = [f'--config.init_from={folder}',
           f'--config.data.data_dir={fake_data_dir}',
           '--config.seq_len=32', '--config.batch_size=8',
           '--config.eval_batch_size=8', '--config.log_every=1',
           '--config.eval_every=2', '--config.eval_steps=1',
           '--config.checkpoint_every=2', '--config.sample.enabled=False',
           '--config.model.dtype=float32']
  # Learning rate 0: the trained parameters are the checkpoint's.
  cfg = IMPORT.load_config(LM, [*flags, '--config.num_steps=2',
                                '--config.optim.learning_rate=0.0'])
  capsys.readouterr()
  row = trainer.train_and_evaluate(cfg, workdir)
  assert f'Started from {folder} (Hugging Face llama)' in (
      capsys.readouterr().out)
  assert np.isfinite(row['loss'])
  with open(os.path.join(workdir, 'config.json')) as f:
    saved = json.load(f)
  assert saved['model']['activation'] == 'swiglu'
  assert saved['model']['rope_scaling'] == 'llama3'
  trained = restore.load_model(workdir)
  assert trained.tokenizer.kind == 'huggingface'
  ids = random_ids(seed=4)
  logits = export_lib.logits_fn(trained.model)(
      {'ids': ids, 'mask': np.ones(ids.shape, bool)})
  assert np.abs(logits - torch_logits(model, ids)).max() < TOLERANCE
  # Two more steps at a real learning rate: resumed, not started again.
  cfg = IMPORT.load_config(LM, [*flags, '--config.num_steps=4'])
  trainer.train_and_evaluate(cfg, workdir)
  out = capsys.readouterr().out
  assert 'Resumed from step 2' in out and 'Started from' not in out
  after = restore.load_model(workdir)
  assert after.step == 4
  assert not np.array_equal(np.asarray(after.model.embed.embedding[...]),
                            np.asarray(trained.model.embed.embedding[...]))
