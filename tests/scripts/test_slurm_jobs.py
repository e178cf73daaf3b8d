"""scripts/launch/slurm_train.sbatch on a real one-node SLURM, submitted as
docs/launch.md says (GPUs and CPUs overridden on the sbatch line).

The time limit's ``--signal=TERM@...`` reaches the job's tasks and not its
batch shell; ``scancel --signal=TERM JOB`` sends exactly that, at the moment
a test chooses (SLURM's own time-limit timer fires up to a minute early).
A requeued job waits two minutes (BeginTime) before it runs again: the
tests start it at once (``Slurm.wait_for``).
"""

import json
import os
import sys
import time

import pytest
import repo
import slurm_cluster
import xla_flags

from jax_transformer import data
from jax_transformer.runtime import faults

# One worker runs them all, on one cluster (pyproject's --dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('slurm')]

SBATCH = os.path.join('scripts', 'launch', 'slurm_train.sbatch')


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
  why = slurm_cluster.missing()
  if why:
    pytest.skip(f'no SLURM here: {why}')
  cluster = slurm_cluster.Slurm(str(tmp_path_factory.mktemp('slurm')))
  yield cluster
  cluster.stop()


@pytest.fixture(scope='module')
def shakespeare(real_data_dir):
  data.prepare('shakespeare', real_data_dir)
  return real_data_dir


def submit(slurm, tmp_path, data_dir, *flags, tasks=1, env=None):
  """The guide's sbatch line on the tiny Shakespeare LM, one CPU device
  per task; returns (job id, workdir, log path)."""
  work, log = tmp_path / 'w', tmp_path / 'slurm-%j.out'
  env = {'JAX_PLATFORMS': 'cpu', 'RESTART_DELAY_S': '0',
         'XLA_FLAGS': xla_flags.cpu(1),
         'PATH': os.path.dirname(sys.executable) + ':' + os.environ['PATH'],
         **(env or {})}
  job = slurm.sbatch(
      '--nodes=1', f'--ntasks-per-node={tasks}', '--gpus-per-node=0',
      '--cpus-per-task=1', '--time=30', f'--output={log}', SBATCH,
      '--config', 'lm_shakespeare:tiny', '--workdir', str(work),
      f'--config.data.data_dir={data_dir}', '--config.sample.enabled=False',
      f'--config.mesh.data={tasks}', '--config.log_every=10',
      '--config.eval_every=100000', '--config.checkpoint_every=100000',
      *flags, env=env, cwd=repo.ROOT)
  return job, work, str(log).replace('%j', job)


def logged_steps(work):
  path = work / 'metrics.jsonl'
  if not path.exists():
    return []
  return [json.loads(line)['step'] for line in path.read_text().splitlines()
          if line.strip()]


def wait_for_a_step_after(work, step, timeout=300):
  """Until the run has logged a step past ``step`` (a started segment)."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if any(s > step for s in logged_steps(work)):
      return
    time.sleep(0.5)
  raise TimeoutError(f'no step after {step} in {work} in {timeout} s')


def wait_for_segment(slurm, job, log, work, start):
  """Until the job's segment ``start`` (2, 3, ...) has resumed and trained
  a step."""
  deadline = time.time() + 300
  while time.time() < deadline:
    text = open(log, errors='replace').read()
    if (f'job {job}, start {start} ' in text
        and text.count('Resumed from step') >= start - 1):
      break
    slurm.hurry(job)
    time.sleep(0.5)
  else:
    raise TimeoutError(f'segment {start} of job {job} did not start')
  wait_for_a_step_after(work, max(logged_steps(work), default=0))


def test_two_tasks_at_the_time_limit_and_preempted_save_requeue_and_finish(
    slurm, shakespeare, tmp_path):
  """Task 1 is made slow to exit (3 s after JAX's shutdown barrier): the task
  that saved first must not end it, every segment must come back, and the
  log must hold them all."""
  job, work, log = submit(
      slurm, tmp_path, shakespeare, '--config.num_steps=300', tasks=2,
      env={faults.ENV: 'sleep3@exit:*', faults.PROCESS_ENV: '1'})
  wait_for_a_step_after(work, 0)
  slurm.command('scancel', '--signal=TERM', job)  # what the time limit sends
  wait_for_segment(slurm, job, log, work, 2)
  slurm.command('scontrol', 'requeue', job)  # what PreemptMode=REQUEUE does
  done = slurm.wait_for(job, 'COMPLETED', 'FAILED', 'CANCELLED', timeout=600)
  text = open(log, errors='replace').read()
  assert done['JobState'] == 'COMPLETED', text[-3000:]
  assert done['ExitCode'] == '0:0' and done['Restarts'] == '2', done
  for start in (1, 2, 3):
    assert f'slurm_train: job {job}, start {start} ' in text, text[-3000:]
  assert text.count('Resumed from step') == 2
  assert 'the tasks saved and stopped (75): requeueing' in text
  assert 'requeue from outside' in text
  assert logged_steps(work)[-1] == 300


def test_one_task_at_the_time_limit_saves_requeues_and_resumes(
    slurm, shakespeare, tmp_path):
  job, work, log = submit(slurm, tmp_path, shakespeare,
                          '--config.num_steps=400')
  wait_for_a_step_after(work, 0)
  slurm.command('scancel', '--signal=TERM', job)
  done = slurm.wait_for(job, 'COMPLETED', 'FAILED', 'CANCELLED', timeout=600)
  text = open(log, errors='replace').read()
  assert done['JobState'] == 'COMPLETED' and done['Restarts'] == '1', (
      done, text[-3000:])
  assert 'start 1 ' in text and 'start 2 ' in text
  assert 'Resumed from step' in text and logged_steps(work)[-1] == 400


def test_scancel_saves_and_is_not_requeued(slurm, shakespeare, tmp_path):
  job, work, log = submit(slurm, tmp_path, shakespeare,
                          '--config.num_steps=100000')
  wait_for_a_step_after(work, 0)
  slurm.command('scancel', job)
  done = slurm.wait_for(job, 'CANCELLED', 'COMPLETED', 'FAILED',
                        hurry=False)
  time.sleep(3)  # a requeue, were there one, would show by now
  after = slurm.job(job)
  text = open(log, errors='replace').read()
  assert after['JobState'] == 'CANCELLED', (done, after, text[-3000:])
  assert after['Restarts'] == '0'
  assert 'saved step' in text and 'not requeueing' in text
  assert (work / 'checkpoints').is_dir()


def test_a_refused_config_exits_2_and_is_not_requeued(slurm, tmp_path):
  job, _, log = submit(slurm, tmp_path, tmp_path / 'data',
                       '--config.num_steps=0')
  done = slurm.wait_for(job, 'FAILED', 'COMPLETED', hurry=False)
  text = open(log, errors='replace').read()
  assert done['ExitCode'] == '2:0' and done['Restarts'] == '0', (
      done, text[-3000:])
  assert 'num_steps' in text and 'not requeueing' in text
