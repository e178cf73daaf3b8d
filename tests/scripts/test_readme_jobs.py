"""The README's jobs, pasted as a user pastes them: relative paths, from a
repository root, on a workdir written before the package moved into
subpackages (tests/fixtures/workdir_v1_flat: lm_shakespeare:tiny trained for
3 steps by the flat layout). It resumes, evaluates, decodes, exports,
imports and plots, and no run prints a warning a user can do nothing
about."""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import repo

from jax_transformer import data

pytestmark = pytest.mark.slow

OLD_WORKDIR = os.path.join(repo.FIXTURES, 'workdir_v1_flat')
# absl's warning lines (W1201 12:00:00.0 ...) and Python's.
WARNING = re.compile(r'^(W\d{4} |WARNING)', re.M)


def readme_command(job: str) -> str:
  """The command of a row of the README's table of jobs."""
  with open(os.path.join(repo.ROOT, 'README.md')) as f:
    for line in f:
      cells = [c.strip() for c in line.split('|')]
      if len(cells) > 3 and cells[1] == job:
        return cells[2].strip('`')
  raise AssertionError(f'the README has no job {job!r}')


@pytest.fixture(scope='module')
def checkout(tmp_path_factory, real_data_dir):
  """A folder laid out as the repository root (its entry points linked),
  holding runs/lm_shakespeare, a copy of the old workdir."""
  root = tmp_path_factory.mktemp('checkout')
  for name in ('train.py', 'scripts', 'configs'):
    os.symlink(os.path.join(repo.ROOT, name), root / name)
  shutil.copytree(OLD_WORKDIR, root / 'runs' / 'lm_shakespeare')
  data.prepare('shakespeare', real_data_dir)
  return root


def run(checkout, real_data_dir, command: str) -> str:
  """Runs command in checkout as a shell would; its stdout. It must
  succeed and print no warning."""
  env = dict(os.environ, TFDS_DATA_DIR=real_data_dir, JAX_PLATFORMS='cpu')
  env.pop('XLA_FLAGS', None)
  args = shlex.split(command)
  assert args[0] == 'python'
  out = subprocess.run([sys.executable, *args[1:]], cwd=checkout, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, f'{command}\n{out.stderr[-3000:]}'
  warnings = WARNING.findall(out.stderr)
  assert not warnings, f'{command}\n{out.stderr[-3000:]}'
  return out.stdout


def test_an_old_workdir_resumes_with_a_relative_path(checkout, real_data_dir):
  out = run(checkout, real_data_dir,
            'python train.py --config lm_shakespeare:tiny --workdir '
            'runs/lm_shakespeare --config.num_steps=4 '
            '--config.sample.enabled=False')
  assert 'Resumed from step 3 in runs/lm_shakespeare.' in out
  steps = os.listdir(checkout / 'runs' / 'lm_shakespeare' / 'checkpoints')
  assert '4' in steps


@pytest.mark.parametrize('job', ['evaluate', 'generate', 'export', 'import',
                                 'plot metrics'])
def test_the_readme_job_runs_as_written(checkout, real_data_dir, job):
  command = readme_command(job)
  if job == 'import':
    # The README imports into the default job's model; the fixture is its
    # tiny preset.
    command = command.replace('--config lm_shakespeare ',
                              '--config lm_shakespeare:tiny ')
    if not (checkout / 'lm.safetensors').exists():
      run(checkout, real_data_dir, readme_command('export'))
  out = run(checkout, real_data_dir, command)
  if job == 'evaluate':
    assert '"perplexity"' in out
  elif job == 'generate':
    assert out.strip()
  elif job == 'import':
    assert (checkout / 'runs' / 'lm_imported' / 'config.json').exists()
  elif job == 'plot metrics':
    assert (checkout / 'curves.png').stat().st_size > 0
