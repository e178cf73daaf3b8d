"""The typed experiment: one home for each default, JSON and the command
line in and out, refusals in one sentence."""

import json

import pytest

from jax_transformer import cli
from jax_transformer.errors import UsageError
from jax_transformer.experiment import (
  DataConfig,
  Experiment,
  OptimConfig,
  base_config,
)
from jax_transformer.model import sharding
from jax_transformer.train import optim


def test_the_config_dict_is_the_dataclasses_defaults():
  cfg = base_config()
  assert json.loads(cfg.to_json()) == json.loads(
      json.dumps(Experiment().to_dict()))
  assert Experiment.of(cfg) == Experiment()


def test_config_files_load_without_jax():
  """A target's compiler starts before JAX (train.py --aot_target): a
  config file, and the experiment it builds, import no JAX."""
  import subprocess
  import sys
  code = ('import sys; from jax_transformer import cli; '
          'from jax_transformer.experiment import Experiment; '
          "Experiment.of(cli.load_config('lm_7b')); "
          "print('jax' in sys.modules)")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, check=True)
  assert out.stdout.strip() == 'False', out.stderr


def test_every_config_file_reads_into_the_typed_form_and_back():
  for spec in ('lm_shakespeare', 'lm_shakespeare:tiny', 'translate_ende',
               'gpt2_small', 'finetune:llama_instruct', 'wmt_base', 'lm_7b'):
    cfg = cli.load_config(spec)
    exp = Experiment.of(cfg)
    assert json.loads(json.dumps(exp.to_dict())) == json.loads(cfg.to_json())
    # JSON, as a workdir keeps it, reads back to the same experiment.
    assert Experiment.of(json.loads(json.dumps(exp.to_dict()))) == exp


def test_a_saved_config_without_newer_fields_takes_their_defaults():
  saved = json.loads(json.dumps(Experiment().to_dict()))
  del saved['lora'], saved['profile'], saved['step_timeout_s']
  del saved['data']['mixture'], saved['optim']['max_skipped_updates']
  del saved['model']['rope_scaling']
  exp = Experiment.of(saved)
  assert exp.lora.rank == 0 and exp.profile.num_steps == 0
  assert exp.optim.max_skipped_updates == 0
  assert exp.model.rope_scaling == 'none'


def test_json_lists_become_the_tuples_fields_hold():
  mixture = [{'name': 'shakespeare', 'weight': 3}]
  exp = Experiment.of({'data': {'mixture': mixture},
                       'optim': {'learning_rate': 1}})
  assert exp.data.mixture == ({'name': 'shakespeare', 'weight': 3},)
  assert isinstance(exp.optim.learning_rate, float)


@pytest.mark.parametrize('values, message', [
    ({'num_step': 3}, "config has no field 'num_step'; did you mean "
     'config.num_steps?'),
    ({'optim': {'learnig_rate': 1e-3}}, "config.optim has no field "
     "'learnig_rate'; did you mean config.optim.learning_rate?"),
    ({'data': 'shakespeare'}, 'config.data must be a group of fields'),
])
def test_a_misspelt_field_is_one_sentence_with_the_closest(values, message):
  with pytest.raises(UsageError) as e:
    Experiment.of(values)
  assert str(e.value).startswith(message)
  assert '\n' not in str(e.value)


def test_replace_reaches_into_parts_and_copies():
  exp = Experiment()
  changed = exp.replace(num_steps=7, **{'optim.z_loss': 1e-4,
                                        'data.name': 'lm1b'})
  assert (changed.num_steps, changed.optim.z_loss, changed.data.name) == (
      7, 1e-4, 'lm1b')
  assert exp == Experiment()  # frozen: the original is unchanged


@pytest.mark.parametrize('changes, message', [
    ({'num_steps': 0}, 'config.num_steps must be an integer >= 1'),
    ({'optim.schedule': 'linear'}, 'config.optim.schedule must be one of'),
    ({'optim.grad_accum_steps': 0}, 'config.optim.grad_accum_steps must be'),
    ({'lora.rank': 4}, 'config.lora.rank=4 trains adapters on a frozen'),
    ({'profile.num_steps': 3}, 'config.profile.num_steps is set'),
    ({'data.worker_count': -1}, 'config.data.worker_count must be'),
    ({'model_kind': 'bert'}, 'model_kind must be one of'),
])
def test_each_part_checks_its_own_fields(changes, message):
  with pytest.raises(UsageError, match=message):
    Experiment().replace(**changes).check()


def test_the_parts_build_what_they_configure():
  exp = Experiment()
  schedule, _ = optim.build(exp.optim, exp.model.d_model, exp.num_steps, {})
  assert float(schedule(0)) == 0.0  # warmup from 0
  assert float(schedule(exp.optim.warmup_steps)) == pytest.approx(
      exp.optim.learning_rate)
  mesh = sharding.make_mesh(exp.mesh.sizes)
  assert mesh.axis_names == ('data', 'fsdp', 'sequence', 'tensor')
  assert DataConfig.of('lm1b').name == 'lm1b'
  with pytest.raises(UsageError, match='config.optim.optimizer'):
    optim.build(OptimConfig(optimizer='sgd'), 8, 10, {})


def test_a_resume_keeps_state_fields_only():
  exp = Experiment()
  runtime = exp.replace(**{'model.dtype': 'bfloat16', 'data.worker_count': 2,
                           'num_steps': 10})
  assert runtime.kept_by_resume() == exp.kept_by_resume()
  assert exp.replace(**{'model.d_ff': 64}).kept_by_resume() != (
      exp.kept_by_resume())


def test_a_config_file_may_return_an_experiment(tmp_path):
  path = tmp_path / 'mine.py'
  path.write_text(
      'from jax_transformer.experiment import Experiment\n'
      'def get_config():\n'
      '  return Experiment(num_steps=5, seq_len=64)\n')
  cfg, _, _ = cli.parse_config_flags(
      ['prog', '--config', str(path), '--config.optim.learning_rate=0.01',
       '--config.data.data_dir=/data'])
  exp = Experiment.of(cfg)
  assert (exp.num_steps, exp.seq_len, exp.optim.learning_rate,
          exp.data.data_dir) == (5, 64, 0.01, '/data')
