"""Batches built in worker processes: the stream resumes exactly from a
saved position, and a position saved with another worker count is refused
in one sentence."""

import numpy as np
import pytest

from jax_transformer import data
from jax_transformer.errors import UsageError
from jax_transformer.experiment import DataConfig, TrainBatches

CFG = {'name': 'ding_en_de', 'direction': 'en-de', 'pack': True}


def iterator(fake_data_dir, workers):
  prepared = data.prepare('ding_en_de', fake_data_dir)
  return data.make_iterator({**CFG, 'data_dir': fake_data_dir}, 'train',
                            prepared.tokenizer, batch_size=4, seq_len=32,
                            seed=2, cache_limit=0, worker_count=workers)


@pytest.mark.slow
def test_workers_resume_their_stream_exactly(fake_data_dir):
  it = iterator(fake_data_dir, 2)
  try:
    for _ in range(3):
      next(it)
    state = it.get_state()
    want = [next(it) for _ in range(3)]
  finally:
    it.close()
  again = iterator(fake_data_dir, 2)
  try:
    again.set_state(state)
    got = [next(again) for _ in range(3)]
  finally:
    again.close()
  for g, w in zip(got, want):
    for key in w:
      np.testing.assert_array_equal(g[key], w[key])


def test_another_worker_count_is_refused_in_one_sentence(fake_data_dir):
  it = iterator(fake_data_dir, 0)
  saved = it.get_state()
  assert saved['worker_count'] == 0
  saved['worker_count'] = 2
  with pytest.raises(UsageError, match=r'made by 2 data workers and this run '
                     r'has 0; .* set config.data.worker_count=2 to resume'):
    it.set_state(saved)
  # A position saved before worker counts were recorded: in-process.
  it.set_state(saved['grain'])


WORKERS_THEN_WAIT = '''
import os, sys, time
from absl import flags
flags.FLAGS(['x'])
from jax_transformer import data
def main():
  prepared = data.prepare('ding_en_de', sys.argv[1])
  it = data.make_iterator({'name': 'ding_en_de', 'direction': 'en-de',
                           'data_dir': sys.argv[1]}, 'train',
                          prepared.tokenizer, batch_size=4, seq_len=32,
                          cache_limit=0, worker_count=2)
  next(it)
  print('ready', flush=True)
  time.sleep(600)
if __name__ == '__main__':
  main()
'''


@pytest.mark.slow
def test_workers_end_when_their_trainer_is_killed(fake_data_dir, tmp_path):
  import os
  import signal
  import subprocess
  import sys
  import time
  script = tmp_path / 'hold.py'
  script.write_text(WORKERS_THEN_WAIT)
  proc = subprocess.Popen([sys.executable, str(script), fake_data_dir],
                          stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == 'ready'
  children = subprocess.run(['pgrep', '-P', str(proc.pid)],
                            capture_output=True, text=True).stdout.split()
  assert children
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  deadline = time.time() + 20
  alive = children
  def running(pid):  # neither gone nor a zombie (a process may go between)
    try:
      with open(f'/proc/{pid}/stat') as f:
        return f.read().split()[2] != 'Z'
    except (FileNotFoundError, ProcessLookupError):
      return False
  while alive and time.time() < deadline:
    time.sleep(0.5)
    alive = [c for c in children if running(c)]
  assert not alive, f'worker processes {alive} outlived a SIGKILLed parent'


def test_initial_state_is_a_fresh_training_streams_with_workers(fake_data_dir):
  """An imported checkpoint's data position resumes under the run's worker
  count (it used to be saved as an in-process stream, and refused)."""
  batches = TrainBatches(
      DataConfig.of({**CFG, 'data_dir': fake_data_dir, 'worker_count': 2,
                     'worker_buffer_size': 2}),
      batch_size=4, seq_len=32, seed=2)
  prepared = data.prepare('ding_en_de', fake_data_dir)
  it = data.train_iterator(batches, prepared.tokenizer, cache_limit=0)
  try:
    fresh = it.get_state()
    it.set_state(data.initial_state(batches))
    first = next(it)
  finally:
    it.close()
  assert data.initial_state(batches) == fresh
  again = data.train_iterator(batches, prepared.tokenizer, cache_limit=0)
  try:
    for key, value in next(again).items():
      np.testing.assert_array_equal(first[key], value)
  finally:
    again.close()
