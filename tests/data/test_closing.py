"""Closing a pipeline fed by worker processes is bounded whatever state its
workers are in (issue 30, item 9): one killed halfway through writing a
batch, another blocked writing its queue. Grain's own close used to wait
forever there, for the rest of the cut message."""

import subprocess
import sys
import threading
import time

import pytest
from train_runs import train

from jax_transformer import data
from jax_transformer.runtime import faults

# Batches of 64 x 1024 x 4 int32 arrays (1 MiB), far over a pipe's 64 KiB:
# a worker whose queue is full is blocked halfway through writing one.
KILL_ONE_THEN_CLOSE = r'''
import glob, os, signal, sys, threading, time
from absl import flags
flags.FLAGS(['x'])
from jax_transformer import data
from jax_transformer.data import workers


def worker_pids():
  """This process's data workers (not multiprocessing's resource tracker)."""
  pids = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/stat') as f:
        ppid = int(f.read().rsplit(')', 1)[1].split()[1])
      with open(f'/proc/{pid}/cmdline') as f:
        cmd = f.read()
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
      continue
    if ppid == os.getpid() and 'resource_tracker' not in cmd:
      pids.append(int(pid))
  return pids


def blocked_writing(pid):
  """Whether one of pid's threads waits inside a write to a full pipe."""
  for wchan in glob.glob(f'/proc/{pid}/task/*/wchan'):
    try:
      with open(wchan) as f:
        if 'pipe_write' in f.read():
          return True
    except FileNotFoundError:
      pass
  return False


def main():
  it = data.make_iterator(
      {'name': 'shakespeare'}, 'train', data.ByteTokenizer(), batch_size=64,
      seq_len=1024, seed=0, process_index=0, process_count=1,
      source=[{'text': 'to be or not ' * 20000}], worker_count=2,
      worker_buffer_size=1)
  assert next(it)['inputs'].shape == (64, 1024)
  pids = worker_pids()
  assert len(pids) == 2, pids
  deadline = time.time() + 120
  while not all(blocked_writing(p) for p in pids):
    assert time.time() < deadline, 'the workers never filled their queues'
    time.sleep(0.2)
  os.kill(pids[0], signal.SIGKILL)  # halfway through writing a batch
  time.sleep(0.5)
  assert blocked_writing(pids[1])
  start = time.monotonic()
  it.close()
  took = time.monotonic() - start
  left = [t.name for t in threading.enumerate() if t.name.startswith('grain')]
  print(f'closed in {took:.1f} s; workers left {worker_pids()}; '
        f'grain threads left {left}', flush=True)
  assert took < workers.CLOSE_TIMEOUT_S / 2, took
  assert not worker_pids() and not left


if __name__ == '__main__':
  main()
'''


@pytest.mark.slow
def test_close_returns_with_one_worker_killed_and_one_blocked(tmp_path):
  script = tmp_path / 'kill_one_then_close.py'
  script.write_text(KILL_ONE_THEN_CLOSE)
  try:
    out = subprocess.run([sys.executable, str(script)], capture_output=True,
                         text=True, timeout=240)
  except subprocess.TimeoutExpired as e:
    pytest.fail(f'closing hung: {(e.stdout or b"")[-2000:]!r}')
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert 'closed in' in out.stdout


@pytest.mark.slow
def test_a_trainer_with_two_workers_exits_within_seconds_of_sigterm(
    tmp_path, real_data_dir):
  """SIGTERM at step 3 of train.py with batches from two workers: it saves,
  closes its iterator and exits 75 within seconds of saying it saved. The
  batches (256 x 64 x 4 int32, 256 KiB) do not fit a pipe, so the workers
  are stopped halfway through writing one."""
  data.prepare('shakespeare', real_data_dir)
  proc = train(tmp_path / 'w', real_data_dir, '--config.num_steps=1000',
               '--config.batch_size=256', '--config.seq_len=64',
               '--config.data.worker_count=2', '--config.log_every=1',
               '--config.eval_every=1000', '--config.checkpoint_every=1000',
               wait=False, env={faults.ENV: 'SIGTERM@step:3'})
  lines = []  # (when, line)
  reader = threading.Thread(target=lambda: lines.extend(
      (time.monotonic(), line) for line in proc.stdout), daemon=True)
  reader.start()
  try:
    proc.wait(timeout=400)
  except subprocess.TimeoutExpired:
    proc.kill()
    pytest.fail('train.py never exited: '
                + ''.join(line for _, line in lines)[-3000:])
  ended = time.monotonic()
  reader.join(30)  # its data workers hold stdout too: they are gone
  assert not reader.is_alive(), 'a data worker outlived train.py'
  out = ''.join(line for _, line in lines)
  assert proc.returncode == 75, out[-3000:]
  saved = [t for t, line in lines if 'SIGTERM: saved step' in line]
  assert saved, out[-3000:]
  assert ended - saved[0] < 20, (ended - saved[0], out[-3000:])
