"""soak.py --hard_kills: one of two processes (or both) SIGKILLed, with and
without the local checkpoint tier; goodput and steps lost per kill.

A two-process run of train.py on 127.0.0.1 (gloo, one CPU device each) is
the reference, uninterrupted. Then, once without the local tier and once
with it (``--local_every``), the same run is started again and again: each
start but the last is hard-killed as soon as metrics.jsonl shows a number
of new steps drawn from the seed (2 to checkpoint_every + 2): process 1
alone on even kills (process 0 then stops itself within
--heartbeat_timeout, or is killed after it), both on odd ones. No handler
runs, nothing is saved. The last start runs to the end, and its final
state and logged losses must equal the reference's bit for bit
(``jax_transformer/bench/resumed.py``, ``check_round``).

Per configuration it reports the steps lost per kill (the last step a
killed start logged, less the step the next start resumed from) and the
goodput: the reference's step time (productive work) over the wall time
of all starts, outside clock, the same accounting as
``train/goodput.across_starts`` (what restarts redo counts as lost).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time

from jax_transformer.bench.resumed import (
  ROOT,
  SoakFailure,
  check_round,
  logged,
  train_command,
)

# Seconds the surviving process gets to notice the lost one (train.py's
# --heartbeat_timeout, set low so a soak does not wait a minute a kill).
HEARTBEAT_S = 10


def _port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def launch(args, workdir: str, log_prefix: str, local_every: int
           ) -> list[subprocess.Popen]:
  """Both processes of one start, logging to LOG_PREFIX.<i>.log."""
  address = f'127.0.0.1:{_port()}'
  env = dict(os.environ, PYTHONUNBUFFERED='1',
             PYTHONPATH=os.pathsep.join(
                 p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))
  procs = []
  for i in range(2):
    tier = ([f'--config.local_checkpoint_dir={workdir}.host{i}',
             f'--config.local_checkpoint_every={local_every}']
            if local_every else [])
    cmd = [*train_command(args, workdir), *tier,
           f'--coordinator_address={address}', '--num_processes=2',
           f'--process_id={i}', f'--heartbeat_timeout={HEARTBEAT_S}']
    with open(f'{log_prefix}.{i}.log', 'w') as log:
      procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT))
  return procs


def logged_steps(workdir: str) -> list[int]:
  """The steps of metrics.jsonl's whole rows, in order."""
  try:
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      text = f.read()
  except FileNotFoundError:
    return []
  out = []
  for line in text.split('\n')[:-1]:  # the last is '' or half-written
    try:
      out.append(json.loads(line)['step'])
    except (json.JSONDecodeError, KeyError):
      pass
  return out


def one_start(args, workdir: str, log_prefix: str, local_every: int,
              kill_after: int | None, kill_all: bool) -> dict:
  """One start, hard-killed once it has logged kill_after new steps (None:
  run to the end); the wall seconds, the last step logged, the statuses."""
  before = len(logged_steps(workdir))
  begun = time.monotonic()
  procs = launch(args, workdir, log_prefix, local_every)
  try:
    last = None
    while kill_after is not None and procs[0].poll() is None:
      steps = logged_steps(workdir)
      if len(steps) - before >= kill_after:
        last = steps[-1]
        for proc in (procs if kill_all else procs[1:]):
          proc.send_signal(signal.SIGKILL)
        break
      if time.monotonic() - begun > args.timeout:
        raise SoakFailure(f'{log_prefix}: no kill moment within '
                               f'{args.timeout:.0f} s.')
      time.sleep(0.02)
    statuses = []
    for proc in procs:
      try:
        statuses.append(proc.wait(timeout=args.timeout if kill_after is None
                                  else HEARTBEAT_S * 3))
      except subprocess.TimeoutExpired:
        proc.kill()
        statuses.append(proc.wait())
  finally:
    for proc in procs:
      proc.kill()
  if kill_after is None and statuses != [0, 0]:
    raise SoakFailure(f'{log_prefix}: the last start exited {statuses}; '
                           f'see {log_prefix}.0.log.')
  return {'wall_s': time.monotonic() - begun, 'last_step': last,
          'statuses': statuses, 'resumed': _resumed(f'{log_prefix}.0.log')}


def _resumed(log_path: str) -> int:
  with open(log_path, errors='replace') as f:
    found = re.findall(r'Resumed from step (\d+)', f.read())
  return int(found[0]) if found else 0


def step_time(workdir: str) -> float:
  """Seconds in training steps of a run's rows (its productive time)."""
  return sum(row.get('step_s', 0.0) for row in logged(workdir)
             if 'step_s' in row)


def configuration(args, reference: str, name: str, local_every: int,
                  rng: random.Random) -> dict:
  """The killed starts and the last one of one configuration; its row."""
  workdir = os.path.join(args.workdir, name)
  for path in (workdir, workdir + '.host0', workdir + '.host1'):
    shutil.rmtree(path, ignore_errors=True)
  starts, lost = [], []
  for k in range(args.hard_kills + 1):
    # Anywhere in a persistent interval: what the workdir alone loses is
    # spread over it.
    kill_after = (rng.randint(2, args.checkpoint_every + 2)
                  if k < args.hard_kills else None)
    got = one_start(args, workdir, f'{workdir}.{k}', local_every, kill_after,
                    kill_all=k % 2 == 1)
    if starts and starts[-1]['last_step'] is not None:
      lost.append(starts[-1]['last_step'] - got['resumed'])
    starts.append(got)
    plan = (f'SIGKILL {"both" if k % 2 else "process 1"} after step '
            f'{got["last_step"]}' if kill_after else 'to the end')
    print(f'{name} start {k}: resumed from step {got["resumed"]}, {plan}, '
          f'exit {got["statuses"]}, {got["wall_s"]:.1f} s', flush=True)
  check_round(args, reference, workdir)
  wall = sum(s['wall_s'] for s in starts)
  return {'configuration': name, 'local_checkpoint_every': local_every,
          'checkpoint_every': args.checkpoint_every, 'kills': len(lost),
          'steps_lost': lost, 'steps_lost_mean': sum(lost) / max(len(lost), 1),
          'wall_s': round(wall, 1),
          'goodput': round(step_time(reference) / wall, 4)}


def hard_kills(args) -> list[dict]:
  """The reference, then each configuration; their rows (raises
  SoakFailure where a final state or loss differs)."""
  os.makedirs(args.workdir, exist_ok=True)
  reference = os.path.join(args.workdir, 'reference')
  shutil.rmtree(reference, ignore_errors=True)
  ref = one_start(args, reference, reference, 0, None, False)
  rows = [{'configuration': 'uninterrupted', 'wall_s': round(ref['wall_s'], 1),
           'goodput': round(step_time(reference) / ref['wall_s'], 4)}]
  for name, every in (('workdir_only', 0), ('local_tier', args.local_every)):
    rows.append(configuration(args, reference, name, every,
                              random.Random(f'{args.seed} {name}')))
  return rows
