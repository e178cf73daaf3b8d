"""The launch guide's scripts (docs/launch.md), run as a user runs them."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import repo
import xla_flags

from jax_transformer import data

pytestmark = pytest.mark.slow

UNTIL_DONE = os.path.join(repo.SCRIPTS, 'launch', 'train_until_done.sh')


def until_done(workdir, data_dir, *flags, env=None, wait=True):
  """train_until_done.sh over lm_shakespeare:tiny on 1 CPU device."""
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'RESTART_DELAY_S': '0',
         'XLA_FLAGS': xla_flags.cpu(1),
         **(env or {})}
  cmd = [shutil.which('bash'), UNTIL_DONE, '--config', 'lm_shakespeare:tiny',
         '--workdir', str(workdir), f'--config.data.data_dir={data_dir}',
         '--config.sample.enabled=False', '--config.mesh.data=1', *flags]
  if wait:
    return subprocess.run(cmd, cwd=repo.ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
  return subprocess.Popen(cmd, cwd=repo.ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True)


def test_a_preempted_run_is_restarted_until_it_finishes(tmp_path,
                                                        real_data_dir):
  data.prepare('shakespeare', real_data_dir)
  out = until_done(tmp_path / 'w', real_data_dir, '--config.num_steps=4',
                   '--config.log_every=1', '--config.checkpoint_every=2',
                   '--config.eval_every=4',
                   env={'JAX_TRANSFORMER_FAULT': 'SIGTERM@step:2'})
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'exited with status 75; restart 1 of 100' in out.stderr
  assert 'train_until_done: finished.' in out.stderr
  steps = [json.loads(line)['step'] for line in
           (tmp_path / 'w' / 'metrics.jsonl').read_text().splitlines()]
  assert steps[-1] == 4 and 'Resumed from step 2' in out.stdout


def test_a_refused_run_is_not_restarted(tmp_path):
  out = until_done(tmp_path / 'w', tmp_path / 'data',
                   '--config.num_steps=0')
  assert out.returncode == 2, out.stderr[-3000:]
  assert 'restart' not in out.stderr.replace('a restart would', '')
  assert "status 2, which a restart would not mend" in out.stderr


def test_a_stop_signal_to_the_loop_and_the_run_is_not_restarted(
    tmp_path, real_data_dir):
  """Ctrl-C or scancel signal the whole process group: train.py saves and
  exits 75, and the loop ends with it."""
  data.prepare('shakespeare', real_data_dir)
  work = tmp_path / 'w'
  proc = until_done(work, real_data_dir, '--config.num_steps=100000',
                    '--config.log_every=1', '--config.eval_every=100000',
                    wait=False)
  try:
    deadline = time.time() + 300
    while not (work / 'metrics.jsonl').exists() and time.time() < deadline:
      time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 75, err[-3000:]
  assert 'stopped by a signal' in err and 'restart 1' not in err
  assert (work / 'checkpoints').exists()


def test_a_shell_without_python_is_not_restarted(tmp_path):
  """ssh's non-interactive shell without the project's environment: 127
  once, not MAX_RESTARTS times."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  for tool in ('dirname', 'sleep'):
    os.symlink(shutil.which(tool), bin_dir / tool)
  out = until_done(tmp_path / 'w', tmp_path / 'data', env={
      'PATH': str(bin_dir)})
  assert out.returncode == 127, out.stderr[-3000:]
  assert 'python could not run train.py (status 127' in out.stderr
  assert 'restart 1' not in out.stderr


def test_a_stop_while_the_loop_waits_to_restart_ends_it(tmp_path,
                                                        real_data_dir):
  data.prepare('shakespeare', real_data_dir)
  proc = until_done(tmp_path / 'w', real_data_dir, '--config.num_steps=4',
                    env={'JAX_TRANSFORMER_FAULT': 'SIGKILL@compile:1',
                         'RESTART_DELAY_S': '600'}, wait=False)
  try:
    deadline = time.time() + 300
    seen = ''
    while 'restart 1 of 100 in 600 s' not in seen and time.time() < deadline:
      seen += proc.stderr.readline()
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)  # the loop; what train.py left may hold the pipe
    err = proc.stderr.readline()
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 137, seen + err
  assert 'stopped by a signal while waiting to restart' in err
