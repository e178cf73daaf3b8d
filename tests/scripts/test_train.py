"""train.py end to end: exact resume, another mesh, SIGTERM, two processes.

These run the real CLI in subprocesses on the offline Shakespeare corpus.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import repo
from train_runs import free_port, together, train

from jax_transformer import data

# One xdist worker for the module: lm_runs (two train.py runs) is shared by
# three tests; spread over both workers it was trained twice.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('test_train')]


@pytest.fixture(scope='module')
def data_dir(real_data_dir):
  data.prepare('shakespeare', real_data_dir)
  return real_data_dir


def metrics(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return {row['step']: row for row in map(json.loads, f)}


def final_params(workdir):
  from jax_transformer.model.params import split
  from jax_transformer.workdirs.restore import load_for_inference
  model, _ = load_for_inference(str(workdir))
  return split(model)[1]


RESUME_FLAGS = ('--config.log_every=1', '--config.eval_every=3',
                '--config.checkpoint_every=3')


@pytest.fixture(scope='module')
def lm_runs(tmp_path_factory, data_dir):
  """A straight 6-step run and the first 3 steps of one to be resumed,
  trained together. The straight one's checkpoint is also the trained LM
  that test_trained_checkpoint_decodes_through_the_cli decodes, and a copy
  of its workdir is what test_a_resume_prints_only_our_lines_... resumes."""
  root = tmp_path_factory.mktemp('lm')
  straight, resumed = root / 'straight', root / 'resumed'
  out, _ = together(
      train(straight, data_dir, '--config.num_steps=6',
            '--config.peak_tflops=0.5', *RESUME_FLAGS, wait=False),
      train(resumed, data_dir, '--config.num_steps=3', *RESUME_FLAGS,
            wait=False))
  return {'straight': straight, 'resumed': resumed, 'straight_out': out}


def test_resume_is_bitwise_exact(lm_runs, data_dir):
  straight, resumed = lm_runs['straight'], lm_runs['resumed']
  out = train(resumed, data_dir, '--config.num_steps=6', *RESUME_FLAGS)
  assert 'Resumed from step 3' in out
  a, b = metrics(straight), metrics(resumed)
  for step in (4, 5, 6):
    for key in ('loss', 'grad_norm', 'learning_rate'):
      assert a[step][key] == b[step][key], (step, key)
  assert a[6]['eval_loss'] == b[6]['eval_loss']
  # Rates over completed steps; compile time once; MFU where a peak is set.
  assert 'compile_s' in a[1] and not any('compile_s' in a[s] for s in a
                                         if s > 1)
  for row in a.values():
    assert row['tokens_per_s'] == pytest.approx(
        row['target_tokens'] / row['step_time_s'])
    assert row['mfu'] == pytest.approx(row['model_tflops_per_s'] / (0.5 * 8))
  assert 'mfu' not in b[4]  # no peak known for CPUs
  pa, pb = final_params(straight), final_params(resumed)
  for key in pa:
    np.testing.assert_array_equal(pa[key], pb[key], err_msg=key)
  # Config and tokenizer are saved beside the checkpoints.
  assert (resumed / 'config.json').exists()
  assert (resumed / 'tokenizer' / 'tokenizer.json').exists()
  assert list((resumed / 'tensorboard').iterdir())


def test_restore_onto_another_mesh(tmp_path, data_dir):
  work, straight = tmp_path / 'w', tmp_path / 'straight'
  mesh = ['--config.mesh.data=1', '--config.mesh.fsdp=4',
          '--config.mesh.tensor=2', '--config.log_every=1']
  out, _ = together(
      train(work, data_dir, '--config.num_steps=3', *mesh, wait=False),
      train(straight, data_dir, '--config.num_steps=5', *mesh, wait=False))
  assert "('fsdp', 'tensor')" in out  # the pre-flight report
  out = train(work, data_dir, '--config.num_steps=5', '--config.log_every=1',
              devices=1)
  assert 'Resumed from step 3' in out
  # One device sums in another order than eight: equal to rounding.
  for step in (4, 5):
    np.testing.assert_allclose(metrics(work)[step]['loss'],
                               metrics(straight)[step]['loss'], rtol=1e-5)


def test_scan_remat_and_chunked_loss_train_like_the_plain_step(tmp_path,
                                                               data_dir):
  """Scanned layers, remat and the chunked loss change memory and compile
  time, not the losses; a run resumes across layer layouts."""
  flags = ['--config.log_every=1', '--config.model.dropout_rate=0',
           '--config.eval_every=100', '--config.checkpoint_every=2']
  scale = ['--config.model.scan_layers=True', '--config.model.remat=dots',
           '--config.loss_chunk_size=96']
  plain, scaled = tmp_path / 'plain', tmp_path / 'scaled'
  together(train(plain, data_dir, '--config.num_steps=4', *flags, wait=False),
           train(scaled, data_dir, '--config.num_steps=2', *flags, *scale,
                 wait=False))
  out = train(scaled, data_dir, '--config.num_steps=4', *flags)
  assert 'Resumed from step 2' in out
  for step in (1, 2, 3, 4):
    np.testing.assert_allclose(metrics(scaled)[step]['loss'],
                               metrics(plain)[step]['loss'], rtol=1e-5)


# Each signal and each data path (in-process batches, worker processes) once:
# the handler saves and exits the same way whichever signal it was, and the
# workers' shutdown is the same whichever signal the trainer heard; the
# third pair of the 2 x 2 grid, SIGTERM without workers, added no path.
@pytest.mark.parametrize('sig,workers', [
    (signal.SIGINT, 0), (signal.SIGTERM, 2)])
def test_stop_signal_saves_exits_75_within_30_s_and_resumes(tmp_path,
                                                           data_dir, sig,
                                                           workers):
  """SIGTERM (preemption) and SIGINT (Ctrl-C): a checkpoint, exit status
  75 (not finished) within 30 s of the signal, and a run that resumes
  (with batches from worker processes too)."""
  work = tmp_path / 'w'
  workers_flag = f'--config.data.worker_count={workers}'
  proc = train(work, data_dir, '--config.num_steps=100000',
               '--config.log_every=1', '--config.checkpoint_every=100000',
               '--config.eval_every=100000', workers_flag, wait=False)
  deadline = time.time() + 300
  while time.time() < deadline:
    if (work / 'metrics.jsonl').exists() and len(metrics(work)) >= 2:
      break
    time.sleep(0.5)
  signalled = time.time()
  proc.send_signal(sig)
  out, _ = proc.communicate(timeout=300)
  assert time.time() - signalled < 30, out[-3000:]
  assert proc.returncode == 75, out[-3000:]
  name = signal.Signals(sig).name
  assert f'{name}: saved step' in out
  saved = int(out.split(f'{name}: saved step ')[1].split(';')[0])
  assert (work / 'checkpoints' / str(saved)).exists()
  out = train(work, data_dir, f'--config.num_steps={saved + 2}',
              '--config.eval_every=100000', workers_flag)
  assert f'Resumed from step {saved}' in out
  assert saved + 2 in metrics(work)


def train_two_processes(work, data_dir, num_steps):
  """Two processes x 4 CPU devices as one job; returns their outputs."""
  address = f'127.0.0.1:{free_port()}'
  procs = [train(work, data_dir, f'--config.num_steps={num_steps}',
                 '--config.checkpoint_every=4', f'--coordinator_address='
                 f'{address}', '--num_processes=2', f'--process_id={i}',
                 devices=4, wait=False) for i in range(2)]
  return together(*procs)


def test_two_processes_train_and_checkpoint(tmp_path, data_dir):
  work = tmp_path / 'w'
  outs = train_two_processes(work, data_dir, num_steps=4)
  assert "'data': 8" in outs[0]  # one mesh over both processes' devices
  assert 'mesh' not in outs[1]   # only process 0 logs
  assert (work / 'checkpoints' / '4').exists()
  assert 4 in metrics(work)
  # Both processes resume, each from its own saved data position.
  outs = train_two_processes(work, data_dir, num_steps=6)
  assert 'Resumed from step 4' in outs[0]
  assert 6 in metrics(work)


def generate(workdir, *runs):
  """scripts/generate.py once per flag list in runs, the runs as concurrent
  processes (each loads and compiles on about one core); their
  CompletedProcesses, in order."""
  procs = [subprocess.Popen(
      [sys.executable, os.path.join(repo.ROOT, 'scripts/generate.py'),
       '--workdir', str(workdir), *flags], cwd=repo.ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, JAX_PLATFORMS='cpu')) for flags in runs]
  try:
    return [subprocess.CompletedProcess(p.args, p.returncode, *outs)
            for p in procs for outs in [p.communicate(timeout=300)]]
  finally:
    for p in procs:
      p.kill()


@pytest.mark.parametrize('config', ['lm_shakespeare', 'translate_ende'])
def test_trained_checkpoint_decodes_through_the_cli(tmp_path, data_dir,
                                                    config, request):
  if config == 'lm_shakespeare':  # trained 6 steps for the resume test
    runs = request.getfixturevalue('lm_runs')
    work, out = runs['straight'], runs['straight_out']
  else:
    # On one device: what is decoded does not depend on the mesh it was
    # trained on (lm_runs' workdir, the other case's, was trained on eight).
    work = tmp_path / 'w'
    out = train(work, data_dir, '--config.num_steps=2', config=config,
                devices=1)
  assert 'Sample' not in out
  text = 'To be, or not to be'
  runs = [['--input', text, '--max_new_tokens', '12'],
          ['--input', text, '--max_new_tokens', '12'],
          ['--input', text, '--beam_size', '3', '--max_new_tokens', '12'],
          ['--input', text, '--temperature', '0.9', '--top_k', '20',
           '--seed', '3', '--max_new_tokens', '12']]
  # An empty --input is refused before the workdir is read (check_args):
  # the same for either model, so one config's run checks it.
  if config == 'lm_shakespeare':
    runs.append(['--input', '  '])
  greedy, again, beam, sampled, *refused = generate(work, *runs)
  assert greedy.returncode == 0, greedy.stderr[-2000:]
  assert again.stdout == greedy.stdout  # greedy is deterministic
  assert beam.returncode == 0, beam.stderr[-2000:]
  assert sampled.returncode == 0, sampled.stderr[-2000:]
  if config == 'lm_shakespeare':
    assert greedy.stdout.startswith(text)
  for empty in refused:
    assert empty.returncode == 2
    assert empty.stderr.count('\n') == 1 and 'empty' in empty.stderr


# Every line a resume may print, as train.py prints it: the sharding table,
# the memory lines, the data pre-flight line, progress, our resume and
# damage lines. Nothing else (Orbax, absl, warnings) is allowed.
OUR_LINES = [r'Job: \d+ process', r'parameter +shape +logical axes',
             r'[\w.]+ +\(\d+(, \d+)*,?\) ',
             r'mesh \{.*\}: [\d,]+ parameter bytes per device$',
             r'activations \[B, T, D\]: the batch split \d+ ways ',
             r'Memory per device[ ,]', r'Data( \S+)? \(\w+\): ',
             r'Resumed from step \d+ in .+\.$',
             r'Compiled the train step in [\d.]+ s\.$',
             r'First step \(\d+\) finished [\d.]+ s after the process '
             r'started: start-up ',
             r'step \d+: train loss [\d.]+, eval loss ',
             r'Time: [\d.]+ s wall, goodput [\d.]+% \(start-up ',
             r'Checkpoint step \d+ could not be read \(.+\); moved it to '
             r'\S+\.unreadable and resumed from step \d+\.$']


def unexpected_lines(out):
  import re
  # The progress bar's states, wherever they are, then line by line.
  out = re.sub(r'train: +\d+%\|[^|]*\|[^\]]*\]', '', out)
  lines = [line.strip() for line in re.split(r'[\r\n]', out)]
  return [line for line in lines if line
          and not any(re.match(p, line) for p in OUR_LINES)]


def test_a_resume_prints_only_our_lines_and_damage_only_ours(
    tmp_path, data_dir, lm_runs):
  """The whole output of a resume, then of a resume past a damaged step."""
  import shutil

  from checkpoint_damage import truncate
  # A copy of lm_runs' straight 6-step run (checkpoints at 3 and 6), resumed
  # with its own flags: no 6-step run of its own.
  work = tmp_path / 'w'
  shutil.copytree(lm_runs['straight'], work)
  flags = ('--config.peak_tflops=0.5', *RESUME_FLAGS)
  out = train(work, data_dir, '--config.num_steps=9', *flags)
  assert out.count('Resumed from step 6 in') == 1, out
  assert unexpected_lines(out) == [], out
  truncate(str(work / 'checkpoints' / '9'))
  out = train(work, data_dir, '--config.num_steps=12', *flags)
  assert out.count('Checkpoint step 9 could not be read') == 1, out
  assert out.count('Resumed from step 6 in') == 1, out
  assert unexpected_lines(out) == [], out
