"""What tpu_vm.sh and gpu_hosts.sh run on the machines, run here: the
stand-in gcloud and ssh of tpu_vm_stand_in.py run each command's script
under a shell in a temporary HOME (one TPU worker, or one folder per GPU
host), with a train.py that records each SIGTERM. The gcloud commands
themselves are checked in test_launch_commands.py."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import repo
from tpu_vm_stand_in import DUMMY_TRAIN_PY, stand_in_tools

LAUNCH = os.path.join(repo.SCRIPTS, 'launch')
# A flag that every shell on the way must hand over as it is.
ODD = """--config.note=it's "odd": $HOME `x` \\ *\nline two"""


def wait_for(path, timeout=30.0):
  deadline = time.time() + timeout
  while not os.path.exists(path):
    assert time.time() < deadline, f'no {path} after {timeout} s'
    time.sleep(0.02)
  time.sleep(0.05)  # written, not only created
  return open(path).read()


def fake_repo(root, venv=True):
  """A checkout with the real restart loop, the recording train.py and,
  with venv, a .venv whose python marks the runs it starts and whose pip
  records its arguments."""
  os.makedirs(os.path.join(root, 'scripts', 'launch'), exist_ok=True)
  shutil.copy(os.path.join(LAUNCH, 'train_until_done.sh'),
              os.path.join(root, 'scripts', 'launch'))
  with open(os.path.join(root, 'train.py'), 'w') as f:
    f.write(DUMMY_TRAIN_PY)
  if venv:
    bin_dir = os.path.join(root, '.venv', 'bin')
    os.makedirs(bin_dir, exist_ok=True)
    for name, text in (
        ('python', f'#!/bin/sh\nJT_PYTHON=venv exec {sys.executable} "$@"\n'),
        ('pip', f'#!/bin/sh\necho "$@" >> {root}/pip.log\n')):
      with open(os.path.join(bin_dir, name), 'w') as f:
        f.write(text)
      os.chmod(os.path.join(bin_dir, name), 0o755)


def end_runs(*homes):
  """Kills what a failed test left running: each home's run wrapper and
  everything under it."""
  for home in homes:
    try:
      pids = [int(open(os.path.join(home, 'train.pid')).read())]
    except (OSError, ValueError):
      continue
    while pids:
      pid = pids.pop()
      children = subprocess.run(['pgrep', '-P', str(pid)],
                                capture_output=True, text=True).stdout
      pids += [int(p) for p in children.split()]
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def terms(home):
  path = os.path.join(home, 'terms')
  return open(path).read().count('TERM') if os.path.exists(path) else 0


@pytest.fixture
def worker(tmp_path):
  """tpu_vm.sh over one worker whose home is tmp_path/home."""
  home = tmp_path / 'home'
  home.mkdir()
  bin_dir = stand_in_tools(str(tmp_path / 'bin'))
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('NODE_COUNT', 'WORKERS', 'TPU_HOLDERS'))}
  env.update(PATH=f'{bin_dir}:{os.environ["PATH"]}',
             CALLS=str(tmp_path / 'gcloud.jsonl'), WORKER_HOME=str(home),
             TPU_NAME='lm-run', ZONE='us-east5-a', TYPE='v5p-128',
             LOGS_DIR=str(tmp_path / 'logs'))

  def tpu_vm(*args, **more):
    return subprocess.run(['bash', os.path.join(LAUNCH, 'tpu_vm.sh'), *args],
                          env={**env, **more}, capture_output=True, text=True,
                          timeout=120)

  tpu_vm.home = str(home)
  yield tpu_vm
  end_runs(str(home))


def test_install_ships_this_working_tree(worker):
  checkout = os.path.join(worker.home, 'jax_transformer')
  fake_repo(checkout)
  out = worker('install', PYTHON='python3')
  assert out.returncode == 0, out.stderr
  assert 'installed.' in out.stdout
  listed = subprocess.run(
      ['git', 'ls-files', '--cached', '--others', '--exclude-standard'],
      cwd=repo.ROOT, capture_output=True, text=True, check=True).stdout
  files = {f for f in listed.splitlines()
           if os.path.lexists(os.path.join(repo.ROOT, f))}
  shipped = {os.path.relpath(os.path.join(d, f), checkout)
             for d, _, names in os.walk(checkout) for f in names}
  assert files <= shipped and not any(f.startswith('.git/') for f in shipped)
  with open(os.path.join(repo.ROOT, 'train.py')) as a, open(
      os.path.join(checkout, 'train.py')) as b:
    assert a.read() == b.read()  # the working tree's, over the old one
  assert open(os.path.join(checkout, 'pip.log')).read() == (
      "install -q -e .[tpu]\n")
  assert not os.path.exists(os.path.join(worker.home, 'jax_transformer.tgz'))


def test_train_status_stop_logs_on_a_worker(worker, tmp_path):
  home = worker.home
  fake_repo(os.path.join(home, 'jax_transformer'))
  # Neither is the run: a stale holder of the TPU, which train ends, and a
  # bystander whose command line names train.py, which stop leaves alone.
  holder = subprocess.Popen(['sleep', '60'])
  bystander = subprocess.Popen([sys.executable, '-c',
                                'import time; time.sleep(60)', 'train.py'])
  try:
    out = worker('train', '--config', 'lm', '--workdir', 'runs/my run',
                 ODD, TPU_HOLDERS=str(holder.pid))
    assert out.returncode == 0, out.stderr
    assert holder.wait(timeout=10) == -signal.SIGTERM
    started = json.loads(wait_for(os.path.join(home, 'train.argv')))
    assert started == {'argv': ['--config', 'lm', '--workdir', 'runs/my run',
                                ODD], 'python': 'venv'}
    sudo = open(os.path.join(home, 'sudo.log')).read()
    assert 'sudo rm -f /tmp/libtpu_lockfile' in sudo
    workdir = os.path.join(home, 'jax_transformer', 'runs', 'my run')
    os.makedirs(workdir)
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write('{"step": 1, "loss": 9.0}\n{"step": 2, "loss": 8.5}\n')

    deadline = time.time() + 30  # a loaded machine starts train.py late
    while True:
      out = worker('status')
      assert out.returncode == 0, out.stderr
      lines = out.stdout.splitlines()
      if 'train.py running (pid' in lines[1] or time.time() > deadline:
        break
      time.sleep(0.5)
    assert lines[0] == 'ACTIVE'
    assert 'train.py running (pid' in lines[1], lines
    assert 'no exit status yet' in lines[1]
    assert lines[2] == (f'last metrics row ({workdir}): '
                        '{"step": 2, "loss": 8.5}')

    out = worker('train', '--config', 'lm')
    assert out.returncode != 0 and 'a run is going' in out.stderr

    out = worker('stop')
    assert out.returncode == 0, out.stderr
    assert 'SIGTERM to' in out.stdout
    # A stop again while the run saves (gcloud retrying a dropped ssh)
    # sends nothing: a second SIGTERM would cut the save short.
    again = worker('stop')
    assert again.returncode == 0, again.stderr
    assert 'none again' in again.stdout
    assert wait_for(os.path.join(home, 'train.exit')).strip() == '75'
    assert terms(home) == 1
    assert bystander.poll() is None

    out = worker('status')
    assert 'no run; last exit status 75' in out.stdout
    assert 'stopped by a signal' in out.stdout
    assert 'no run to stop' in worker('stop').stdout

    out = worker('logs', WORKERS='1')
    assert out.returncode == 0, out.stderr
    log = (tmp_path / 'logs' / 'worker-0.log').read_text()
    assert 'stopped by a signal' in log
  finally:
    holder.kill()
    bystander.kill()


def test_the_stop_script_under_bash_signals_the_run_once_and_not_itself(
    worker, tmp_path):
  """The stop command run as the worker's shell runs it: bash exits 0 (its
  own command line names the loop), the run's train.py gets exactly one
  SIGTERM."""
  home = worker.home
  fake_repo(os.path.join(home, 'jax_transformer'))
  assert worker('train', '--config', 'lm').returncode == 0
  wait_for(os.path.join(home, 'train.argv'))
  calls = tmp_path / 'gcloud.jsonl'
  calls.unlink()
  out = worker('stop', WORKER_HOME='')  # record it, run nothing
  assert out.returncode == 0, out.stderr
  command = json.loads(calls.read_text().splitlines()[0])[-1]
  assert 'train_until_done' in command  # what `pkill -f` would have hit
  ran = subprocess.run(['bash', '-c', command], env={**os.environ,
                                                     'HOME': home},
                       capture_output=True, text=True, timeout=30)
  assert ran.returncode == 0, ran.stderr
  assert wait_for(os.path.join(home, 'train.exit')).strip() == '75'
  assert terms(home) == 1


@pytest.fixture
def gpu_hosts(tmp_path):
  """gpu_hosts.sh over hosts whose homes are tmp_path/hosts/HOST, the
  repository at tmp_path/repo, and a login PATH without `python`."""
  bin_dir = stand_in_tools(str(tmp_path / 'bin'))
  env = dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}',
             CALLS=str(tmp_path / 'calls.jsonl'),
             HOSTS_HOME=str(tmp_path / 'hosts'), LOGIN_PATH='/usr/bin:/bin',
             HOSTS='gpu-0 gpu-1', REPO_DIR=str(tmp_path / 'repo'))
  env.pop('PYTHON', None)

  def run(*args, **more):
    return subprocess.run(['bash', os.path.join(LAUNCH, 'gpu_hosts.sh'),
                           *args], env={**env, **more}, capture_output=True,
                          text=True, timeout=120)

  run.homes = [str(tmp_path / 'hosts' / h) for h in ('gpu-0', 'gpu-1')]
  run.calls = tmp_path / 'calls.jsonl'
  yield run
  end_runs(*run.homes)


def test_gpu_hosts_start_with_the_venv_and_stop_every_host(gpu_hosts,
                                                           tmp_path):
  assert shutil.which('python', path='/usr/bin:/bin') is None
  fake_repo(str(tmp_path / 'repo'))
  out = gpu_hosts('--config', 'lm_1_3b', '--workdir', '/shared/runs/x', ODD)
  assert out.returncode == 0, out.stderr
  for i, home in enumerate(gpu_hosts.homes):
    started = json.loads(wait_for(os.path.join(home, 'train.argv')))
    assert started == {'argv': [
        '--config', 'lm_1_3b', '--workdir', '/shared/runs/x', ODD,
        '--coordinator_address=gpu-0:4321', '--num_processes=2',
        f'--process_id={i}'], 'python': 'venv'}
  out = gpu_hosts(STOP='1')
  assert out.returncode == 0, out.stderr
  for home in gpu_hosts.homes:
    assert wait_for(os.path.join(home, 'train.exit')).strip() == '75'
    assert terms(home) == 1
  hosts = [json.loads(line)[1]
           for line in gpu_hosts.calls.read_text().splitlines()]
  assert hosts == ['gpu-0', 'gpu-1'] * 2


def test_gpu_hosts_stop_goes_past_a_host_that_does_not_answer(gpu_hosts,
                                                             tmp_path):
  """Without a venv the run's python is python3; a host ssh cannot reach
  does not keep the next one from stopping."""
  fake_repo(str(tmp_path / 'repo'), venv=False)
  out = gpu_hosts('--config', 'lm_1_3b')
  assert out.returncode == 0, out.stderr
  for home in gpu_hosts.homes:
    assert json.loads(wait_for(os.path.join(home, 'train.argv')))[
        'python'] is None
  out = gpu_hosts(STOP='1', DOWN_HOSTS='gpu-0')
  assert out.returncode == 1
  assert 'could not stop gpu-0 (ssh status 255)' in out.stderr
  first, second = gpu_hosts.homes
  assert wait_for(os.path.join(second, 'train.exit')).strip() == '75'
  assert terms(second) == 1 and terms(first) == 0
  out = gpu_hosts(STOP='1')
  assert out.returncode == 0, out.stderr
  assert wait_for(os.path.join(first, 'train.exit')).strip() == '75'
  assert terms(first) == 1 and terms(second) == 1


def sent_script(command):
  """SCRIPT of a command line `bash -c SCRIPT NAME ARGS...`."""
  return subprocess.run(
      ['bash', '-c', 'bash() { printf %s "$2"; }; eval "$1"', '_', command],
      capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which('shellcheck') is None,
                    reason='no shellcheck here')
def test_the_scripts_sent_to_the_machines_pass_shellcheck(worker, gpu_hosts,
                                                         tmp_path):
  """What each command sends (shellcheck sees the launch scripts, not the
  scripts they quote)."""
  calls = tmp_path / 'gcloud.jsonl'
  for args in (('install',), ('mount',), ('prepare', '--config', 'x'),
               ('train', '--config', 'x'), ('status',), ('stop',)):
    out = worker(*args, WORKER_HOME='', BUCKET='gs://b')  # runs nothing
    assert out.returncode == 0, out.stderr
  commands = [json.loads(line)[-1] for line in calls.read_text().splitlines()
              if '--command' in line]
  assert len(commands) == 7
  down = 'gpu-0 gpu-1'  # ssh records the command and runs nothing
  assert gpu_hosts('--config', 'x', DOWN_HOSTS=down).returncode == 255
  assert gpu_hosts(STOP='1', DOWN_HOSTS=down).returncode == 1
  commands += [json.loads(line)[2]
               for line in gpu_hosts.calls.read_text().splitlines()]
  assert len(commands) == 10
  for command in commands:
    script = sent_script(command)
    checked = subprocess.run(['shellcheck', '-s', 'bash', '-'], input=script,
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + script
