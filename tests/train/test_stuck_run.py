"""A run that is alive but makes no progress ends itself: every thread's
stack, one line, exit status 124 (runtime/stall.py)."""

import os
import subprocess
import time

import pytest
from train_runs import train

from jax_transformer import data
from jax_transformer.cli import load_config
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.runtime import faults, stall


def test_the_automatic_limit_grows_with_the_longest_interval():
  progress = stall.Progress(None, now=0.0)
  assert progress.limit == stall.AUTO_FLOOR_S
  progress.report(now=1.0)
  progress.report(now=61.0)  # a 60 s interval: 20x is 1200 s
  assert progress.limit == 1200.0
  assert progress.overdue(now=61.0 + 1200.0) is None
  assert progress.overdue(now=61.0 + 1201.0) == 1201.0


def test_an_explicit_limit_and_a_pause_for_compiling():
  progress = stall.Progress(5.0, now=0.0)
  assert progress.overdue(now=5.0) is None
  assert progress.overdue(now=6.0) == 6.0
  progress.pause()
  assert progress.overdue(now=100.0) is None  # compiling: not judged
  progress.resume(now=100.0)
  assert progress.overdue(now=104.0) is None
  progress.report(now=104.0)
  assert progress.limit == 5.0  # explicit: not changed by what it saw


def test_the_watch_ends_the_process_with_the_stacks_and_one_line(capfd):
  ended = []
  watch = stall.StallWatch(0.2, '/nonexistent/checkpoints', poll=0.05,
                           exit_fn=lambda msg, status: ended.append(
                               (msg, status)))
  try:
    for _ in range(200):
      if ended:
        break
      watch._stopped.wait(0.05)  # pylint: disable=protected-access
  finally:
    watch.stop()
  (message, status), = ended
  assert status == stall.EXIT_STUCK == 124
  assert message.startswith('No training step finished for 0 s '
                            '(config.step_timeout_s=0.2)'), message
  assert 'Current thread' in capfd.readouterr().err  # the stack dump


def test_a_bad_step_timeout_is_refused_in_one_sentence():
  for bad in (-1.0, 'soon'):
    cfg = load_config('lm_shakespeare:tiny')
    with cfg.ignore_type():
      cfg.step_timeout_s = bad
    with pytest.raises(UsageError, match='config.step_timeout_s must be'):
      Experiment.of(cfg).check()


def test_a_fault_names_its_action_phase_and_step():
  assert faults.parse('SIGTERM@eval:8') == ('SIGTERM', 'eval', 8)
  with pytest.raises(UsageError, match='ACTION@PHASE:STEP'):
    faults.parse('SIGTERM@lunch:8')
  assert faults.parse('sleep20@save:*') == ('sleep20', 'save', None)
  with pytest.raises(UsageError, match='STEP a number or'):
    faults.parse('sleepy@save:*')


def test_a_sleep_fault_acts_once_at_any_step_of_its_phase(monkeypatch):
  monkeypatch.setattr(faults, '_planned', faults.parse('sleep1@save:*'))
  start = time.monotonic()
  faults.reached('eval', 7)
  assert faults._planned is not None
  faults.reached('save', 7)
  assert faults._planned is None and time.monotonic() - start >= 1


@pytest.mark.slow
def test_a_stalled_input_pipeline_ends_the_run_with_124_and_its_stacks(
    tmp_path, real_data_dir, monkeypatch):
  data.prepare('shakespeare', real_data_dir)
  # The reader of step 5's batch blocks for good, as on a stalled mount.
  monkeypatch.setenv(faults.ENV, 'stall@data:5')
  proc = train(tmp_path / 'w', real_data_dir, '--config.num_steps=8',
               '--config.checkpoint_every=2',
               # Long enough that no real step or save of a loaded machine
               # passes it (3 s did, in CI beside other jobs), short enough
               # to end the stalled run soon after step 4's save.
               '--config.step_timeout_s=20',
               wait=False)
  try:
    out, _ = proc.communicate(timeout=300)
  except subprocess.TimeoutExpired:
    proc.kill()
    raise
  assert proc.returncode == stall.EXIT_STUCK, out[-3000:]
  # Every thread's stack, the stalled main thread's among them.
  assert out.count('Thread 0x') + out.count('Current thread 0x') > 1, out
  assert 'faults.py", line' in out and 'in train_and_evaluate' in out, out
  last = out.strip().splitlines()[-1]
  assert last.startswith('No training step finished for '), last
  assert ('(config.step_timeout_s=20); the stacks of all threads are above. '
          'Stopping with exit status 124: ') in last, last
  assert 'resume from checkpoint step 4.' in last, last
  assert os.path.isdir(tmp_path / 'w' / 'checkpoints' / '4')
