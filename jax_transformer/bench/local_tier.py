"""The local checkpoint tier's cost: the default job's training step time
with and without it, side by side.

Each side is ``train.py --config lm_shakespeare`` as one process in a fresh
temporary workdir, ``STEPS`` steps, saving the workdir only at the last
step (``checkpoint_every`` = STEPS) and evaluating only there, on two
batches (evaluation is timed apart anyway). The 'with' side also writes
the local tier (``config.local_checkpoint_dir``, in ``/dev/shm`` where it
exists) every ``local_every`` steps. Rounds interleave: without, with,
without, with, ...

What is compared is each run's own clock (``train/goodput.py``): the
seconds charged to steps, data waits and checkpoints (a local save's wait
for the step before it and its own write are charged to checkpoints),
from the first step to the last; start-up, compile and evaluation are
left out. Divided by the steps run: seconds per step. The goal (issue 40)
is a local tier under 3% of step time over at least 200 steps.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from jax_transformer.bench.timing import load_average

SIDES = ('without', 'with')
# The run's clock's parts counted as training (goodput.PARTS less
# start-up, compile, evaluation and 'other').
TRAIN_PARTS = ('step', 'data_wait', 'checkpoint')
WAIT_S = 3600.0


def flags(steps: int) -> list[str]:
  """train.py's flags common to both sides."""
  return ['--config', 'lm_shakespeare', f'--config.num_steps={steps}',
          f'--config.checkpoint_every={steps}', f'--config.eval_every={steps}',
          '--config.eval_steps=2', '--config.sample.enabled=False']


def local_root() -> str | None:
  """Where the local tier's temporary directories go: /dev/shm if there."""
  return '/dev/shm' if os.path.isdir('/dev/shm') else None


def summary_of(metrics_text: str) -> dict:
  """The run's goodput summary: the last metrics row that has one."""
  for line in reversed(metrics_text.splitlines()):
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if 'total_step_s' in row:
      return row
  raise ValueError('no goodput summary in metrics.jsonl')


def round_row(side: str, round_: int, steps: int, summary: dict,
              local_every: int | None) -> dict:
  """One run's row: seconds per training step and the parts."""
  parts = {p: summary[f'total_{p}_s'] for p in
           (*TRAIN_PARTS, 'startup', 'compile', 'eval')}
  train_s = sum(parts[p] for p in TRAIN_PARTS)
  return {'suite': 'local_tier', 'side': side, 'round': round_,
          'steps': steps, 'step_s': train_s / steps,
          'train_s': round(train_s, 3),
          'steps_part_s': round(parts['step'], 3),
          'data_wait_s': round(parts['data_wait'], 3),
          'checkpoint_s': round(parts['checkpoint'], 3),
          # Every multiple of local_every: LocalSaving skips none on a run
          # that was not stopped (exit status 0).
          'local_saves': steps // local_every if local_every else 0,
          'startup_s': round(parts['startup'], 3),
          'compile_s': round(parts['compile'], 3),
          'eval_s': round(parts['eval'], 3),
          'wall_s': round(summary['wall_s'], 3)}


def summary_row(rows: list[dict], load_before: float | None,
                load_after: float | None) -> dict:
  """Medians of each side, the median of per-round ratios with/without
  and the overhead in percent of the step time without."""
  times = {side: [r['step_s'] for r in rows if r['side'] == side]
           for side in SIDES}
  ratios = [w / wo for wo, w in zip(times['without'], times['with'])]
  ratio = statistics.median(ratios)
  return {'suite': 'local_tier', 'side': 'summary',
          'steps': rows[0]['steps'], 'rounds': len(ratios),
          'without_s': statistics.median(times['without']),
          'with_s': statistics.median(times['with']),
          'ratio': round(ratio, 4), 'ratio_min': round(min(ratios), 4),
          'ratio_max': round(max(ratios), 4),
          'overhead_percent': round((ratio - 1) * 100, 2),
          'local_saves': max(r['local_saves'] for r in rows),
          'load_average_before': load_before,
          'load_average_after': load_after}


def _run(side: str, round_: int, steps: int, local_every: int) -> dict:
  """One train.py run of a side, in fresh temporary directories."""
  with tempfile.TemporaryDirectory(prefix='local_tier_bench_') as work:
    cmd = [sys.executable, '-u', 'train.py', *flags(steps),
           '--workdir', os.path.join(work, 'run')]
    local = None
    if side == 'with':
      local = tempfile.mkdtemp(prefix='local_tier_bench_',
                               dir=local_root())
      cmd += [f'--config.local_checkpoint_dir={local}',
              f'--config.local_checkpoint_every={local_every}']
    try:
      started = time.time()
      proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            timeout=WAIT_S, check=False)
      if proc.returncode:
        raise RuntimeError(f'train.py ({side}, round {round_}) exited '
                           f'{proc.returncode}:\n{proc.stdout[-3000:]}')
      with open(os.path.join(work, 'run', 'metrics.jsonl')) as f:
        summary = summary_of(f.read())
    finally:
      if local:
        shutil.rmtree(local, ignore_errors=True)
  row = round_row(side, round_, steps, summary,
                  local_every if side == 'with' else None)
  return dict(row, process_s=round(time.time() - started, 3),
              load_average=load_average())


def run(steps: int = 200, rounds: int = 2, local_every: int = 10):
  """A row per run (without, with, without, with, ...), then the summary."""
  load_before = load_average()
  rows = []
  for r in range(rounds):
    for side in SIDES:
      row = _run(side, r, steps, local_every)
      rows.append(row)
      yield row
  yield summary_row(rows, load_before, load_average())
