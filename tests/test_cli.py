"""Bad command lines and configs: one line on stderr, exit status 2.

jax_transformer.cli in-process (the config flags, the entry-point wrapper),
train.py's flag parsing and pre-flight checks in-process, and train.py and
import_params.py as real subprocesses once each.
"""

import importlib.util
import os
import subprocess
import sys

import pytest
import repo
import script_helpers
from absl import flags

from jax_transformer import cli
from jax_transformer.errors import UsageError

LM = os.path.join(repo.ROOT, 'configs', 'lm_shakespeare.py')
TINY = LM + ':tiny'


def _load_train():
  spec = importlib.util.spec_from_file_location(
      'train_script', os.path.join(repo.ROOT, 'train.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)  # defines its flags on absl's FLAGS once
  return module


TRAIN = _load_train()


def one_line(err: str, prog: str) -> str:
  """The single stderr line, checked to be one line from prog."""
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith(f'{prog}: error: '), err
  return lines[0]


# ----------------------------------------------------------------------------
# --config and --config.a.b=value.


@pytest.mark.parametrize('argv, needles', [
    (['--config.optim.learnin_rate=0.1'],
     ["config.optim of", "has no field 'learnin_rate'",
      'did you mean --config.optim.learning_rate?']),
    (['--config.nofield', '1'], ["has no field 'nofield'", 'num_steps']),
    (['--config.num_steps.x=1'], ['config.num_steps is 600, not a group']),
    (['--config', 'configs/nope.py'],
     ['configs/nope.py: the file does not exist']),
    (['--config', LM + ':huge'], ["Unknown preset 'huge'; choose tiny"]),
    (['--config', os.path.join(repo.ROOT, 'jax_transformer', 'errors.py')],
     ['has no get_config() function']),
    (['--config.num_steps=abc'],
     ['--config.num_steps=abc:', "give a value of the flag's type"]),
    (['--config.mesh.fsdp', 'two'], ['--config.mesh.fsdp=two:']),
    (['--worcdir=x'], ['Unknown flag --worcdir; did you mean --workdir?']),
])
def test_train_flags_refuse_bad_config_in_one_sentence(argv, needles):
  values = flags.FlagValues()
  TRAIN.define_flags(values)
  with pytest.raises(UsageError) as err:
    TRAIN.parse_flags(['train.py', *argv], values)
  message = cli.one_line(err.value)
  for needle in needles:
    assert needle in message, message


def test_train_flags_parse_overrides_and_default_workdir():
  values = flags.FlagValues()
  TRAIN.define_flags(values)
  rest = TRAIN.parse_flags(['train.py', '--config', TINY,
                            '--config.optim.learning_rate=0.5',
                            '--noconfig.sample.enabled'], values)
  assert rest == ['train.py']
  assert values.config.optim.learning_rate == 0.5
  assert values.config.sample.enabled is False
  assert values.workdir == os.path.join('runs', 'lm_shakespeare')


def test_stray_arguments_are_refused():
  values = flags.FlagValues()
  TRAIN.define_flags(values)
  with pytest.raises(UsageError, match=r"Unexpected arguments \['stray'\]"):
    TRAIN.parse_flags(['train.py', 'stray'], values)


def test_import_params_reads_config_flags_as_train_does(capsys, tmp_path):
  script = script_helpers.load_script('import_params')
  cfg = script.load_config(TINY, ['--config.num_steps=7'])
  assert cfg.num_steps == 7
  code = script.main(['--from', str(tmp_path / 'x.pt'), '--config', TINY,
                      '--workdir', str(tmp_path / 'w'),
                      '--config.optim.learnin_rate=1'])
  assert code == 2
  line = one_line(capsys.readouterr().err, 'import_params.py')
  assert 'did you mean --config.optim.learning_rate?' in line
  assert not (tmp_path / 'w').exists()


# ----------------------------------------------------------------------------
# train.py's pre-flight: refused before data preparation, nothing written.


@pytest.mark.parametrize('override, needle', [
    ('--config.mesh.data=3', 'needs 3 devices but 8 are available'),
    ('--config.batch_size=12', 'Batch size 12 is not divisible by the 8'),
    ('--config.model.num_heads=3', 'd_model=32 is not divisible by '
     'num_heads=3'),
    ('--config.seq_len=100', 'config.seq_len=100 exceeds model.max_len=64'),
    ('--config.num_steps=0', 'config.num_steps must be an integer >= 1'),
    ('--config.model_kind=gpt', "model_kind must be one of"),
    ('--config.mesh.dcn_data=-1', 'config.mesh.dcn_data must be an integer '
     '>= 0'),
    # One slice: nothing crosses a data-center network.
    ('--config.mesh.dcn_data=2', 'config.mesh.dcn_data=2 and dcn_fsdp=0 do '
     'not fit mesh'),
])
def test_train_refuses_a_config_that_cannot_run_before_data(
    override, needle, tmp_path, capsys):
  workdir, data_dir = tmp_path / 'run', tmp_path / 'tfds'
  values = flags.FlagValues()
  TRAIN.define_flags(values)
  TRAIN.parse_flags(['train.py', '--config', TINY, override,
                     f'--workdir={workdir}',
                     f'--config.data.data_dir={data_dir}',
                     '--compilation_cache_dir=', '--noretain_host_memory'],
                    values)
  code = TRAIN.main(['train.py'], values)
  assert code == cli.EXIT_USAGE
  assert needle in one_line(capsys.readouterr().err, 'train.py')
  assert not workdir.exists() and not data_dir.exists()


@pytest.mark.parametrize('runtimes, sentence', [
    ([], "config.mesh asks for 64 devices but this install has 8 CPU devices "
     "and no TPU or GPU runtime: pip install -e '.[tpu]' on a TPU VM or "
     "'.[cuda]' on GPU hosts."),
    (['libtpu'], 'config.mesh asks for 64 devices but JAX found 8 CPU devices '
     'and no accelerator here, although libtpu is installed'),
])
def test_a_mesh_larger_than_a_cpu_install_names_the_extra(
    runtimes, sentence, tmp_path, capsys, monkeypatch):
  from jax_transformer.runtime import targets  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(targets, 'accelerator_runtimes', lambda: runtimes)
  workdir = tmp_path / 'run'
  values = flags.FlagValues()
  TRAIN.define_flags(values)
  TRAIN.parse_flags(['train.py', '--config', TINY, '--config.mesh.data=8',
                     '--config.mesh.fsdp=8', f'--workdir={workdir}',
                     '--compilation_cache_dir=', '--noretain_host_memory'],
                    values)
  assert TRAIN.main(['train.py'], values) == cli.EXIT_USAGE
  line = one_line(capsys.readouterr().err, 'train.py')
  assert line.startswith(f'train.py: error: {sentence}'), line
  assert not workdir.exists()


# ----------------------------------------------------------------------------
# The wrapper: UsageError is one line and 2; anything else is a bug.


def test_entry_point_reports_usage_errors_and_keeps_other_tracebacks(capsys):
  @cli.entry_point('tool.py')
  def bad_input():
    raise UsageError('The thing\nis wrong;   fix it.')

  @cli.entry_point('tool.py')
  def bug():
    raise KeyError('a bug')

  assert bad_input() == 2
  assert capsys.readouterr().err == ('tool.py: error: The thing is wrong; '
                                     'fix it.\n')
  with pytest.raises(KeyError):
    bug()


def test_argparse_errors_are_one_line_and_exit_2(capsys):
  parser = cli.ArgumentParser(prog='tool.py')
  parser.add_argument('--steps', type=int, required=True)
  for argv in ([], ['--steps', 'x'], ['--step', '3']):
    with pytest.raises(SystemExit) as exit_:
      parser.parse_args(argv)
    assert exit_.value.code == 2
    line = one_line(capsys.readouterr().err, 'tool.py')
    assert line.endswith('see --help.')


# ----------------------------------------------------------------------------
# Real processes: what a user sees.


def _run(*argv):
  env = dict(os.environ, PYTHONPATH=repo.ROOT, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, *argv], cwd=repo.ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_train_cli_misspelt_override_exits_2_in_one_line(tmp_path):
  proc = _run(os.path.join(repo.ROOT, 'train.py'), '--config', TINY,
              '--workdir', str(tmp_path / 'run'),
              '--config.optim.learnin_rate=0.1')
  assert proc.returncode == 2, proc.stderr
  line = one_line(proc.stderr, 'train.py')
  assert 'learnin_rate' in line and '--config.optim.learning_rate' in line
  assert 'Traceback' not in proc.stderr and proc.stdout == ''
  assert not (tmp_path / 'run').exists()


def test_then_exit_keeps_the_status_and_freezes_what_is_alive():
  """In a process of its own: frozen objects stay frozen for the rest of
  it, which is the point at exit and a leak anywhere else."""
  code = ('import gc, sys\n'
          'from jax_transformer import cli\n'
          'before = gc.get_freeze_count()\n'
          'status = cli.then_exit(lambda: 3)()\n'
          'print(before, gc.get_freeze_count() > 1000)\n'
          'try:\n'
          '  cli.then_exit(lambda: 1 / 0)()\n'
          'except ZeroDivisionError:\n'
          '  print("raised")\n'
          'sys.exit(status)\n')
  done = subprocess.run([sys.executable, '-c', code], cwd=repo.ROOT,
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 3, done.stderr
  assert done.stdout.split() == ['0', 'True', 'raised'], done.stdout


def test_flax_is_imported_without_ipython_which_stays_importable():
  """Where IPython is installed (it is on this project's machines, though
  no dependency asks for it), importing the model does not import it, and
  a later import of it still works."""
  code = ('import importlib.util, sys\n'
          'import jax_transformer.model.models\n'
          'print("flax.nnx" in sys.modules, "IPython" in sys.modules)\n'
          'if importlib.util.find_spec("IPython"):\n'
          '  import IPython\n'
          '  print(IPython.get_ipython() is None)\n')
  done = subprocess.run([sys.executable, '-c', code], cwd=repo.ROOT,
                        capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split()[:2] == ['True', 'False'], done.stdout
