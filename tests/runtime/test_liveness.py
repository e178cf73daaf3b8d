"""The heartbeat watchdog's judgement, on a fake clock and an in-memory
store: no processes, no JAX runtime."""

import os
import subprocess
import sys
import threading
import time

import pytest

from jax_transformer.runtime import liveness
from jax_transformer.runtime.liveness import DONE, Monitor, Watchdog


def test_a_peer_whose_heartbeat_stops_is_lost_after_the_timeout():
  m = Monitor(process_id=0, num_processes=3, timeout=10, now=0)
  for t in range(0, 30, 2):  # process 1 beats throughout, process 2 until 8
    m.asking(t)
    m.answered({0: str(t), 1: str(t), 2: str(min(t, 8))}, t)
    if t <= 18:
      assert m.lost(t) is None, t
  assert m.lost(28) == 'Lost process 2 of 3 (no heartbeat for 20 s)'


def test_a_peer_that_never_beat_is_lost_a_timeout_after_the_start():
  m = Monitor(process_id=1, num_processes=2, timeout=5, now=100)
  m.answered({1: '1'}, 104)
  assert m.lost(104) is None
  m.answered({1: '2'}, 106)
  assert m.lost(106) == 'Lost process 0 of 2 (no heartbeat for 6 s)'


def test_silence_counts_up_to_the_last_answer_not_up_to_now():
  """A watchdog that could not ask for a while (its own process was
  starved) does not blame the others for the gap."""
  m = Monitor(process_id=0, num_processes=2, timeout=5, now=0)
  m.answered({1: 'a'}, 1)
  assert m.lost(60) is None
  m.answered({1: 'b'}, 61)
  assert m.lost(61) is None


def test_a_process_that_left_normally_is_never_lost():
  m = Monitor(process_id=0, num_processes=2, timeout=5, now=0)
  m.answered({1: DONE}, 1)
  m.answered({1: DONE}, 100)
  assert m.lost(100) is None


@pytest.mark.parametrize('process_id, words', [
    (1, 'Lost process 0 of 2, which hosts the coordinator (no answer for '
        '7 s)'),
    (0, 'The coordination service in this process (0 of 2) has not answered '
        'for 7 s')])
def test_an_unanswered_store_is_a_lost_coordinator(process_id, words):
  m = Monitor(process_id=process_id, num_processes=2, timeout=5, now=0)
  m.asking(3)   # no answer: the request hangs or fails
  m.asking(4)   # a retry does not restart the clock
  assert m.lost(8) is None
  assert m.lost(10) == words


def test_the_resume_hint_names_the_newest_complete_checkpoint(tmp_path):
  for name in ('2', '10', '12.orbax-checkpoint-tmp-1733', 'tokenizer'):
    (tmp_path / name).mkdir()
  assert liveness.resume_hint(str(tmp_path)) == (
      'restart all processes to resume from checkpoint step 10')
  assert liveness.resume_hint(str(tmp_path / 'absent')) == (
      'no checkpoint was saved yet')


def test_a_listing_that_hangs_does_not_hold_the_hint(monkeypatch):
  monkeypatch.setattr(liveness, 'newest_checkpoint',
                      lambda directory: time.sleep(30))
  assert liveness.resume_hint('gs://bucket/run/checkpoints', wait=0.1) == (
      'restart all processes to resume from the newest checkpoint in '
      'gs://bucket/run/checkpoints')


class FakeStore:
  """The coordination service's key-value store, shared in memory; a
  process can be made to fall silent (killed) or cut off (its calls fail)."""

  def __init__(self):
    self.values, self.silent, self.cut_off = {}, set(), set()
    self.lock = threading.Lock()

  def client(self, process):
    store = self

    class Client:

      def key_value_set(self, key, value, allow_overwrite=False):
        assert allow_overwrite
        if process in store.cut_off:
          raise RuntimeError('UNAVAILABLE: Socket closed')
        with store.lock:
          if process not in store.silent:
            store.values[key] = value

      def key_value_dir_get(self, prefix):
        if process in store.cut_off:
          raise RuntimeError('UNAVAILABLE: Socket closed')
        with store.lock:
          return [(k, v) for k, v in store.values.items()
                  if k.startswith(prefix)]

    return Client()


def start(store, num_processes, checkpoint_dir='/nonexistent'):
  """A watchdog per process (timeout 1 s: a loaded machine may starve a
  thread for a fraction of it), and the messages each one would exit
  with."""
  exits = {p: [] for p in range(num_processes)}
  dogs = [Watchdog(store.client(p), p, num_processes, timeout=1,
                   checkpoint_dir=str(checkpoint_dir), interval=0.05,
                   exit_fn=exits[p].append)
          for p in range(num_processes)]
  return dogs, exits


def wait_for(condition, seconds=10):
  deadline = time.monotonic() + seconds
  while not condition():
    assert time.monotonic() < deadline, 'timed out'
    time.sleep(0.02)


def test_watchdogs_name_the_silent_process_and_the_newest_checkpoint(tmp_path):
  (tmp_path / '8').mkdir()
  store = FakeStore()
  dogs, exits = start(store, 3, tmp_path)
  time.sleep(1.5)
  assert exits == {0: [], 1: [], 2: []}  # all beating: nobody is lost
  store.silent.add(2)  # killed: its heartbeat stops moving
  wait_for(lambda: exits[0] and exits[1])
  for p in (0, 1):
    assert exits[p][0].startswith('Lost process 2 of 3 (no heartbeat for ')
    assert exits[p][0].endswith(
        f's); stopping process {p} too (exit status 69): restart all '
        'processes to resume from checkpoint step 8.')
  for dog in dogs:
    dog.stop()


def test_a_cut_off_process_names_the_coordinator():
  store = FakeStore()
  dogs, exits = start(store, 2)
  store.cut_off.add(1)
  wait_for(lambda: exits[1])
  assert exits[1] == [
      'Lost process 0 of 2, which hosts the coordinator (no answer for 1 s); '
      'stopping process 1 too (exit status 69): no checkpoint was saved '
      'yet.']
  for dog in dogs:
    dog.stop()


def test_a_stopped_watchdog_says_done_and_is_not_missed():
  store = FakeStore()
  dogs, exits = start(store, 2)
  dogs[1].stop()
  assert store.values['jax_transformer/heartbeat/1'] == DONE
  time.sleep(2)  # twice the timeout
  assert exits == {0: [], 1: []}
  dogs[0].stop()


def test_exit_now_flushes_prints_one_line_and_exits_69():
  """In a child process, since it ends the process it runs in."""
  path = os.path.join(os.path.dirname(liveness.__file__), 'liveness.py')
  code = ('import importlib.util, sys\n'
          f'spec = importlib.util.spec_from_file_location("l", {path!r})\n'
          'l = importlib.util.module_from_spec(spec)\n'
          'spec.loader.exec_module(l)\n'
          'print("buffered", end="")\n'
          'l.exit_now("Lost process 1 of 2 (no heartbeat for 61 s)")\n'
          'print("never")\n')
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == liveness.EXIT_LOST_PROCESS == 69
  assert proc.stdout == 'buffered'
  assert proc.stderr == '\nLost process 1 of 2 (no heartbeat for 61 s)\n'
