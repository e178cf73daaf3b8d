"""Kill training at random moments; resuming must lose nothing.

    python scripts/soak.py --workdir /tmp/soak --cycles 20 --seed 0

Trains once without interruption (DIR/reference), then starts train.py again
and again in DIR/round_<r>, killing each start at a moment drawn from
--seed: SIGKILL (which can tear a checkpoint mid-write) or SIGTERM (which
saves and exits with status 75), some seconds after launch (imports, data,
compiling), as a checkpoint appears (mid-save), or after some logged steps.
A round ends when a start finishes; its final checkpoint must then equal the
reference's bit for bit (parameters, optimizer state, step, RNG and data
position) and every loss it logged, before or after a kill, the reference's
at that step. Once --cycles kills are spent, the open round runs to its end.

The seed fixes each cycle's plan (signal, moment); what the moment hits
still depends on the machine's speed. --last_step first stops starts at
each phase of the last step (compile, step, evaluation, save) with SIGTERM
and SIGKILL, at points the trainer reaches (runtime/faults.py), so those
hit the same moment on any machine. --damage damages a committed
checkpoint at random before each restart (truncated, emptied, random
bytes, a file or folder gone), always leaving one readable.

--hard_kills N runs two processes instead and hard-kills one of them (or
both) N times, without and with the local checkpoint tier
(``--local_every``), reporting goodput and steps lost per kill
(``scripts/soak_hosts.py``), rows it appends to the benchmark record
(``docs/records/measured.jsonl``; ``--record FILE``, ``--no_record``).

Prints one line per start, then the verdict; exits 1 naming the first
difference. Config overrides pass through after ``--``, e.g.
``-- --config.mesh.data=2``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
from typing import NamedTuple, Sequence

import checkpoint_damage

from jax_transformer import cli
from jax_transformer.bench.resumed import (
  ROOT,
  SoakFailure,
  check_round,
  train_command,
)
from jax_transformer.runtime import faults
from jax_transformer.runtime.exits import EXIT_INTERRUPTED


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--workdir', required=True,
                 help='holds the reference run, the rounds and their logs')
  p.add_argument('--cycles', type=int, default=20,
                 help='starts to kill, in all rounds together')
  p.add_argument('--seed', type=int, default=0,
                 help='draws every kill (signal and moment)')
  p.add_argument('--config', default='lm_shakespeare:tiny',
                 help='NAME[:preset] or FILE[:preset]')
  p.add_argument('--data_dir', default=None,
                 help="the datasets' root (default: the config's)")
  p.add_argument('--num_steps', type=int, default=16)
  p.add_argument('--checkpoint_every', type=int, default=2)
  p.add_argument('--keep_checkpoints', type=int, default=2,
                 help='few, so that kills also land while old ones go')
  p.add_argument('--eval_every', type=int, default=4)
  p.add_argument('--max_start_delay', type=float, default=15.0,
                 help='latest kill, in seconds, of the after-launch kind')
  p.add_argument('--last_step', action='store_true',
                 help='first, stop starts at each phase of the last step')
  p.add_argument('--damage', action='store_true',
                 help='damage a committed checkpoint before each restart')
  p.add_argument('--hard_kills', type=int, default=0,
                 help='instead: SIGKILL one of two processes (or both) this '
                 'many times per configuration, without and with the local '
                 'tier; goodput and steps lost per kill')
  p.add_argument('--local_every', type=int, default=2,
                 help='--hard_kills: the local tier\'s interval (a divisor '
                 'of --checkpoint_every)')
  p.add_argument('--record', default=None,
                 help='--hard_kills: the benchmark record its rows are '
                 'appended to (default docs/records/measured.jsonl)')
  p.add_argument('--no_record', action='store_true',
                 help='--hard_kills: append no record (a trial run)')
  p.add_argument('--timeout', type=float, default=900.0,
                 help='seconds one start may take before it counts as hung')
  p.add_argument('overrides', nargs='*',
                 help='more train.py flags, after --')
  args = p.parse_args(argv)
  if args.last_step and args.num_steps < 3:
    p.error('--last_step needs --num_steps 3 or more.')
  if args.hard_kills < 0 or (args.hard_kills and (
      args.local_every < 1 or args.checkpoint_every % args.local_every)):
    p.error('--hard_kills must be 0 or more and --local_every a positive '
            'divisor of --checkpoint_every.')
  if args.cycles < 0:
    p.error(f'--cycles must be 0 or more, got {args.cycles}.')
  for name in ('num_steps', 'checkpoint_every', 'keep_checkpoints',
               'eval_every'):
    if getattr(args, name) < 1:
      p.error(f'--{name} must be a positive integer, got '
              f'{getattr(args, name)}.')
  # train.py runs in the checkout's root: paths must not depend on ours.
  args.workdir = os.path.abspath(args.workdir)
  if args.data_dir:
    args.data_dir = os.path.abspath(args.data_dir)
  path, colon, preset = args.config.partition(':')
  if cli.names_a_file(path):  # a name is resolved by train.py itself
    args.config = os.path.abspath(path) + colon + preset
  return args


class Kill(NamedTuple):
  """When and how one start is stopped.

  anchor 'launch': ``delay`` seconds after the start; 'checkpoint': when
  the ``count``-th new entry of checkpoints/ appears (an Orbax temporary
  directory first: mid-save), then ``delay`` seconds; 'steps': as soon as
  metrics.jsonl holds ``count`` more rows; 'phase': the start signals
  itself when it reaches ``phase`` of step ``count`` (faults.PHASES).
  """
  signum: int
  anchor: str
  count: int = 0
  delay: float = 0.0
  phase: str = ''

  def __str__(self):
    name = signal.Signals(self.signum).name
    if self.anchor == 'phase':
      return f'{name} {_WHILE[self.phase]} step {self.count}'
    if self.anchor == 'launch':
      return f'{name} {self.delay:.2f} s after launch'
    if self.anchor == 'checkpoint':
      return f'{name} {self.delay:.2f} s after checkpoint entry {self.count}'
    return f'{name} after {self.count} logged step' + 's' * (self.count > 1)


def draw(rng: random.Random, max_start_delay: float) -> Kill:
  """One cycle's kill; the sequence depends on the seed alone."""
  signum = rng.choice((signal.SIGKILL, signal.SIGTERM))
  anchor = rng.choice(('launch', 'checkpoint', 'steps'))
  if anchor == 'launch':
    return Kill(signum, anchor, delay=rng.uniform(0, max_start_delay))
  if anchor == 'checkpoint':
    return Kill(signum, anchor, rng.randint(1, 3), rng.uniform(0, 0.3))
  return Kill(signum, anchor, rng.randint(1, 4))


# How a 'phase' kill reads, by faults.PHASES.
_WHILE = {'data': 'reading the batch of', 'compile': 'compiling',
          'step': 'running', 'eval': 'evaluating', 'save': 'saving'}


def last_step_kills(num_steps: int) -> list[Kill]:
  """Stops at each phase of the last step N, in an order where each lands:
  a fresh start is stopped by SIGTERM in N's save (and finishes); the next
  round's starts by SIGKILL in N's save, then in step N (back to an older
  checkpoint), by SIGTERM in step N-1 (saving N-1), by SIGKILL and SIGTERM
  while compiling N (which saves N with its evaluation cut), then by
  SIGKILL and SIGTERM in the evaluation of N that a restart finishes."""
  n, term, kill = num_steps, signal.SIGTERM, signal.SIGKILL
  plan = [(term, 'save', n), (kill, 'save', n), (kill, 'step', n),
          (term, 'step', n - 1), (kill, 'compile', n), (term, 'compile', n),
          (kill, 'eval', n), (term, 'eval', n)]
  return [Kill(signum, 'phase', step, phase=phase)
          for signum, phase, step in plan]


def launch(args, workdir: str, log_path: str, kill: Kill | None = None
           ) -> subprocess.Popen:
  # Unbuffered: a killed start's log holds everything it printed.
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  env.pop(faults.ENV, None)
  if kill is not None and kill.anchor == 'phase':
    name = signal.Signals(kill.signum).name
    env[faults.ENV] = str(faults.Fault(name, kill.phase, kill.count))
  # This checkout's package, whatever else is installed.
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (ROOT, env.get('PYTHONPATH')) if p)
  with open(log_path, 'w') as log:
    return subprocess.Popen(train_command(args, workdir), cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def entries(workdir: str) -> set[str]:
  try:
    return set(os.listdir(os.path.join(workdir, 'checkpoints')))
  except FileNotFoundError:
    return set()


def rows(workdir: str) -> int:
  try:
    with open(os.path.join(workdir, 'metrics.jsonl'), 'rb') as f:
      return f.read().count(b'\n')
  except FileNotFoundError:
    return 0


def wait_for(proc: subprocess.Popen, kill: Kill, workdir: str,
             timeout: float) -> bool:
  """Polls until the kill's moment (True), or the start's exit or timeout
  seconds (False)."""
  if kill.anchor == 'phase':
    return False  # the start stops itself
  started, seen, logged = time.monotonic(), entries(workdir), rows(workdir)
  new: set[str] = set()
  moment = None
  while proc.poll() is None:
    now = time.monotonic()
    if now - started >= timeout:
      return False
    if kill.anchor == 'launch' and now - started >= kill.delay:
      return True
    if kill.anchor == 'steps' and rows(workdir) - logged >= kill.count:
      return True
    if kill.anchor == 'checkpoint' and moment is None:
      new |= entries(workdir) - seen
      if len(new) >= kill.count:
        moment = now + kill.delay
    if moment is not None and now >= moment:
      return True
    time.sleep(0.005)
  return False


def finish(proc: subprocess.Popen, timeout: float, log_path: str) -> int:
  try:
    return proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    raise SoakFailure(f'A start ran over {timeout:.0f} s (hung?); see '
                      f'{log_path}.') from None


def allowed(kill: Kill | None) -> set[int]:
  """Exit statuses a start may end with: finished, or stopped by kill."""
  if kill is None:
    return {0}
  if kill.signum == signal.SIGTERM:
    # 75 once the trainer's handler is installed, -SIGTERM before it.
    return {0, EXIT_INTERRUPTED, -signal.SIGTERM}
  return {0, -signal.SIGKILL}


def start(args, workdir: str, log_path: str, kill: Kill | None) -> int:
  """One start of train.py, killed as planned; its exit status."""
  proc = launch(args, workdir, log_path, kill)
  if kill is not None and wait_for(proc, kill, workdir, args.timeout):
    proc.send_signal(kill.signum)
  status = finish(proc, args.timeout, log_path)
  if status not in allowed(kill):
    with open(log_path) as f:
      tail = f.read()[-3000:]
    plan = kill or 'no kill'
    raise SoakFailure(f'A start exited with status {status} ({plan}); '
                      f'{log_path} ends:\n{tail}')
  return status


def what_it_read(log_path: str) -> str:
  """The checkpoint a start resumed from, and the torn ones it skipped,
  as its log says (empty for a fresh start)."""
  with open(log_path, errors='replace') as f:
    text = f.read()
  resumed = re.findall(r'Resumed from step (\d+)', text)
  skipped = re.findall(r'Checkpoint step (\d+) could not be read', text)
  said = f', resumed from step {resumed[0]}' if resumed else ''
  if skipped:
    said += f' (moved aside unreadable step {", ".join(skipped)})'
  return said


class Damage:
  """Damages one committed step of a workdir at random (a kind of
  checkpoint_damage), never the last readable one: a run with no readable
  checkpoint is refused, not restarted from scratch."""

  def __init__(self, rng: random.Random):
    self._rng = rng
    self._done = set()  # (step, inode) of the step folders damaged

  def __call__(self, workdir: str) -> str:
    """Damages one; says which and how (empty when it damaged none)."""
    folder = os.path.join(workdir, 'checkpoints')
    steps = sorted((n for n in entries(workdir) if n.isdigit()), key=int)
    intact = [name for name in steps
              if self._key(folder, name) not in self._done]
    if len(intact) < 2:
      return ''
    # The newest half the time: that is the one a restart reads.
    name = self._rng.choice([intact[-1], self._rng.choice(intact[:-1])])
    how = self._rng.choice(sorted(checkpoint_damage.DAMAGES))
    self._done.add(self._key(folder, name))
    checkpoint_damage.DAMAGES[how](os.path.join(folder, name))
    return f'{how} step {name}, '

  @staticmethod
  def _key(folder: str, name: str) -> tuple[str, int]:
    # A step saved again after its damaged folder was moved aside is a new
    # folder: the inode tells them apart.
    return name, os.stat(os.path.join(folder, name)).st_ino


def soak(args) -> dict[str, int]:
  """Runs the reference and the killed rounds; returns counts of what
  happened (starts, kills, rounds checked). Raises SoakFailure."""
  os.makedirs(args.workdir, exist_ok=True)
  reference = os.path.join(args.workdir, 'reference')
  start(args, reference, reference + '.log', None)
  rng = random.Random(args.seed)
  damage = Damage(random.Random(f'{args.seed} damage')) if args.damage else None
  kills = last_step_kills(args.num_steps) if args.last_step else []
  kills += [draw(rng, args.max_start_delay) for _ in range(args.cycles)]
  counts = {'starts': 1, 'killed': 0, 'rounds': 0}
  workdir, attempt = None, 0
  for cycle, kill in enumerate(kills + [None]):
    if kill is None and workdir is None:
      break  # every round already finished
    if workdir is None:
      workdir = os.path.join(args.workdir, f'round_{counts["rounds"]}')
      attempt = 0
    damaged = damage(workdir) if damage and attempt else ''
    log_path = f'{workdir}.{attempt}.log'
    status = start(args, workdir, log_path, kill)
    counts['starts'] += 1
    counts['killed'] += status != 0
    print(f'cycle {cycle}: {os.path.basename(workdir)} start {attempt}, '
          f'{damaged}{kill or "no kill"}: exit {status}'
          f'{what_it_read(log_path)}', flush=True)
    attempt += 1
    if status == 0:
      check_round(args, reference, workdir)
      counts['rounds'] += 1
      print(f'  {os.path.basename(workdir)} equals the uninterrupted run '
            'bit for bit', flush=True)
      workdir = None
  return counts


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  if args.hard_kills:
    return main_hard_kills(args)
  try:
    counts = soak(args)
  except SoakFailure as err:
    print(f'FAILED: {err}', file=sys.stderr)
    return 1
  print(f'OK: {counts["rounds"]} rounds, {counts["starts"]} starts, '
        f'{counts["killed"]} stopped early; every final state and logged '
        'loss equals the uninterrupted run.')
  return 0


def main_hard_kills(args) -> int:
  """--hard_kills: a JSON row per configuration, then the verdict; the
  rows are appended to the benchmark record (suite 'soak')."""
  import json  # pylint: disable=g-import-not-at-top

  # The two-process soak, which imports nothing of this file.
  import soak_hosts  # pylint: disable=g-import-not-at-top

  from jax_transformer.bench import record, timing  # pylint: disable=g-import-not-at-top
  load_before = timing.load_average()
  try:
    rows = soak_hosts.hard_kills(args)
  except SoakFailure as err:
    print(f'FAILED: {err}', file=sys.stderr)
    return 1
  for row in rows:
    print(json.dumps(row), flush=True)
  if not args.no_record:
    path = args.record or str(record.MEASURED)
    record.append(record.make('soak', [dict(r, suite='soak') for r in rows],
                              sys.argv[1:], None, load_before,
                              timing.load_average()), path)
    print(f'Recorded in {path}.', file=sys.stderr)
  print('OK: every killed configuration ended equal to the uninterrupted '
        'run, bit for bit.')
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
