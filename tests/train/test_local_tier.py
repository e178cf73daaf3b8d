"""The local checkpoint tier across a hard kill of one of two processes:
the restart resumes from the local tier (the killed host's own copy, or
its peer's when its directory is gone) and ends equal to a run that never
stopped. Two-process runs of train.py on 2 x 2 CPU devices, as users run
them."""

import os
import shutil
import signal

import numpy as np
import pytest
from train_runs import free_port, train

from jax_transformer import data
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.runtime.workdir import resolve
from jax_transformer.train import local_tier

STEPS = 10
FLAGS = ('--config.log_every=1', '--config.eval_every=100',
         '--config.checkpoint_every=4', f'--config.num_steps={STEPS}',
         '--heartbeat_timeout=10')


@pytest.fixture(scope='module')
def data_dir(real_data_dir):
  data.prepare('shakespeare', real_data_dir)
  return real_data_dir


def two_processes(work, data_dir, local=None, env=None):
  """Both processes of one run started (not waited for); local: the two
  hosts' local directories (the tier saved every 2 steps) or None."""
  address = f'127.0.0.1:{free_port()}'
  procs = []
  for i in range(2):
    tier = (f'--config.local_checkpoint_dir={local[i]}',
            '--config.local_checkpoint_every=2') if local else ()
    procs.append(train(work, data_dir, *FLAGS, *tier,
                       f'--coordinator_address={address}',
                       '--num_processes=2', f'--process_id={i}', devices=2,
                       wait=False, env=env))
  return procs


def outputs(procs, ok=True):
  """Each process's output, once all have ended; ok: all exited 0."""
  outs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=300)
      outs.append(out)
      if ok:
        assert p.returncode == 0, out[-3000:]
  finally:
    for p in procs:
      p.kill()
  return outs


def final_params(workdir, steps=STEPS):
  """The parameters of the workdir's newest (persistent) checkpoint."""
  from jax_transformer.workdirs import restore
  _, params, step = restore.load(str(workdir))
  assert step == steps
  return params


def resumed_step(out):
  line = next(line for line in out.splitlines() if 'Resumed from step' in line)
  return int(line.split('Resumed from step ')[1].split()[0]), line


@pytest.mark.parametrize('fields, words', [
    ({'local_checkpoint_every': 5}, 'needs config.local_checkpoint_dir'),
    ({'local_checkpoint_dir': '/x'}, 'needs config.local_checkpoint_every'),
    ({'local_checkpoint_dir': '/x', 'local_checkpoint_every': 7},
     'does not divide config.checkpoint_every=200'),
    ({'local_checkpoint_dir': '/x', 'local_checkpoint_every': 0},
     'must be an integer >= 1'),
])
def test_local_tier_fields_are_refused_in_one_sentence(fields, words):
  with pytest.raises(UsageError, match=words):
    Experiment().replace(**fields).check()


def test_a_local_dir_inside_the_workdir_is_refused(tmp_path):
  workdir = resolve(str(tmp_path / 'w'))
  with pytest.raises(UsageError, match='is inside the workdir'):
    local_tier.check_paths(str(tmp_path / 'w' / 'l'), workdir)
  local_tier.check_paths(str(tmp_path), workdir)


def test_a_local_dir_of_another_run_is_refused_and_a_new_run_clears_it(
    tmp_path):
  first, second = resolve(str(tmp_path / 'a')), resolve(str(tmp_path / 'b'))
  local = str(tmp_path / 'local')
  local_tier.claim(local, first)
  os.makedirs(os.path.join(local, '8'))  # a step of run a
  with pytest.raises(UsageError, match='holds the local checkpoints of '
                     'another run'):
    local_tier.claim(local, second)
  local_tier.claim(local, first)  # a has no config.json: a new run
  assert not os.path.exists(os.path.join(local, '8'))
  os.makedirs(os.path.join(local, '8'))
  first.root.mkdir(parents=True)
  first.config.write_text('{}')
  local_tier.claim(local, first)  # a restart of a keeps its steps
  assert os.path.exists(os.path.join(local, '8'))


@pytest.mark.slow
def test_a_local_dir_every_host_sees_is_refused(tmp_path, data_dir):
  procs = two_processes(tmp_path / 'w', data_dir,
                        [tmp_path / 'shared', tmp_path / 'shared'])
  for out, proc in zip(outputs(procs, ok=False), procs):
    assert proc.returncode == 2, out[-2000:]
    assert 'is one folder that several processes see' in out, out[-2000:]


@pytest.mark.slow
def test_a_hard_kill_of_one_process_resumes_from_the_local_tier(tmp_path,
                                                                data_dir):
  straight = tmp_path / 'straight'
  outputs(two_processes(straight, data_dir))
  want = final_params(straight)

  work = tmp_path / 'w'
  local = [tmp_path / 'host0', tmp_path / 'host1']
  # Process 1 dies at once as step 9 is dispatched: no signal handler, no
  # save; step 8 was the last finished (its saves may be torn). Process 0
  # stops itself when it hears no more from process 1.
  procs = two_processes(work, data_dir, local, env={
      'JAX_TRANSFORMER_FAULT': 'SIGKILL@step:9',
      'JAX_TRANSFORMER_FAULT_PROCESS': '1'})
  outputs(procs, ok=False)
  assert procs[1].returncode == -signal.SIGKILL
  # The same moment, with host 1 replaced by an empty machine.
  replaced = tmp_path / 'replaced'
  shutil.copytree(work, replaced / 'w')
  shutil.copytree(local[0], replaced / 'host0')
  os.makedirs(replaced / 'host1')
  # The copy stands for the same run: its local tier names its workdir.
  (replaced / 'host0' / 'WORKDIR').write_text(
      os.path.realpath(replaced / 'w') + '\n')

  out = outputs(two_processes(work, data_dir, local))[0]
  step, line = resumed_step(out)
  assert step >= 8 - 2 and '(local tier)' in line, line
  for name, got in final_params(work).items():
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want[name]),
                                  err_msg=name)

  out = outputs(two_processes(
      replaced / 'w', data_dir, [replaced / 'host0', replaced / 'host1']))[0]
  step, line = resumed_step(out)
  assert step >= 8 - 2 and '(local tier)' in line, line  # the peer's copy
  for name, got in final_params(replaced / 'w').items():
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want[name]),
                                  err_msg=name)


@pytest.mark.slow
def test_a_damaged_local_step_is_moved_aside_and_the_workdir_read(tmp_path,
                                                                  data_dir):
  from checkpoint_damage import truncate
  work, local = tmp_path / 'w', tmp_path / 'local'
  tier = (f'--config.local_checkpoint_dir={local}',
          '--config.local_checkpoint_every=1', '--config.checkpoint_every=3',
          '--config.eval_every=100')
  train(work, data_dir, '--config.num_steps=5', *tier, devices=1)
  train(tmp_path / 's', data_dir, '--config.num_steps=6',
                   '--config.checkpoint_every=3', '--config.eval_every=100',
                   devices=1)
  shutil.rmtree(work / 'checkpoints' / '5')  # the local tier is newer
  truncate(str(local / '5'))
  out = train(work, data_dir, '--config.num_steps=6', *tier, devices=1)
  assert 'Local checkpoint step 5 could not be read' in out, out[-3000:]
  assert 'Resumed from step 3 in' in out and '(persistent tier)' in out
  assert (local / '5.unreadable').exists()
  want = final_params(tmp_path / 's', 6)
  for name, got in final_params(work, 6).items():
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want[name]),
                                  err_msg=name)
