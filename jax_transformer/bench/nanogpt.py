"""The default job against nanoGPT, each as a user would run it.

Both train the same bytes (the default job's Shakespeare split and byte
tokenizer, written as nanoGPT's ``train.bin``/``val.bin``) with the same
size (4 layers, d_model 128, 4 heads, d_ff 512, context 128), batch (32),
schedule (AdamW 2e-3, b2 0.98, weight decay 0.1, clip 1, 50 warmup steps,
cosine to 2e-4 at step 600), dropout 0.1 and number of steps, on the same
cores, one after the other, each as a subprocess (nanoGPT on float32 CPU,
without torch.compile). nanoGPT's own code comes from a clone given by
``--nanogpt_dir``; it is run, not imported.

Validation loss is scored the same way for both: nats per byte over every
window of the validation stream (windows start every 128 bytes and predict
128). The report gives wall time at equal steps, validation loss at equal
steps, and at equal wall time (each side's loss at the other's end time,
from its evaluations every ``eval_every`` steps).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from jax_transformer import data
from jax_transformer.data.splits import stream_tokens
from jax_transformer.errors import UsageError
from jax_transformer.experiment import doors

STEPS = 600
EVAL_EVERY = 100
HPARAMS = dict(n_layer=4, n_head=4, n_embd=128, block_size=128,
               batch_size=32, dropout=0.1, bias=False, learning_rate=2e-3,
               min_lr=2e-4, beta1=0.9, beta2=0.98, weight_decay=0.1,
               grad_clip=1.0, warmup_iters=50, gradient_accumulation_steps=1)

_SCORE = r'''
import json, sys, numpy as np, torch
from model import GPT, GPTConfig
ckpt = torch.load(sys.argv[1], map_location='cpu')
model = GPT(GPTConfig(**ckpt['model_args']))
model.load_state_dict({k.removeprefix('_orig_mod.'): v
                       for k, v in ckpt['model'].items()})
model.eval()
val = np.fromfile(sys.argv[2], dtype=np.uint16).astype(np.int64)
t = int(sys.argv[3]); n = (len(val) - 1) // t
total = 0.0
with torch.no_grad():
  for s in range(0, n, 64):
    idx = range(s, min(s + 64, n))
    x = torch.tensor(np.stack([val[i * t:i * t + t] for i in idx]))
    y = torch.tensor(np.stack([val[i * t + 1:i * t + t + 1] for i in idx]))
    _, loss = model(x, y)
    total += float(loss) * len(idx) * t
print(json.dumps({'step': ckpt['iter_num'], 'val_loss': total / (n * t)}))
'''


def write_bytes(workdir: str) -> int:
  """The default job's train/validation token streams as nanoGPT data;
  returns the vocabulary size (the model's, padded as ours is)."""
  cfg = doors.load('lm_shakespeare')
  prepared = data.prepare(cfg.data.name)
  spec = data.get_spec(cfg.data.name)
  os.makedirs(workdir, exist_ok=True)
  for split, name in (('train', 'train'), ('validation', 'val')):
    tokens = stream_tokens(data.load_source(cfg.data.name, split), spec,
                           prepared.tokenizer)
    tokens.astype(np.uint16).tofile(os.path.join(workdir, f'{name}.bin'))
  vocab = cfg.model_config(prepared.tokenizer.vocab_size).vocab_size
  with open(os.path.join(workdir, 'meta.pkl'), 'wb') as f:
    pickle.dump({'vocab_size': vocab}, f)
  return vocab


def run_nanogpt(nanogpt_dir: str, work: str, steps: int) -> dict:
  """Trains nanoGPT (checkpointing at every evaluation, each kept) and
  scores each checkpoint on every validation window."""
  repo = os.path.join(work, 'nanogpt')
  shutil.copytree(nanogpt_dir, repo, ignore=shutil.ignore_patterns('.git'))
  write_bytes(os.path.join(repo, 'data', 'bytes'))
  args = [f'--{k}={v}' for k, v in HPARAMS.items()] + [
      '--dataset=bytes', '--device=cpu', '--compile=False',
      '--dtype=float32', f'--max_iters={steps}', f'--lr_decay_iters={steps}',
      f'--eval_interval={EVAL_EVERY}', '--eval_iters=20', '--log_interval=1',
      '--always_save_checkpoint=True', '--out_dir=out']
  start = time.perf_counter()
  proc = subprocess.Popen([sys.executable, '-u', 'train.py', *args], cwd=repo,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  saved, first_iter = [], None
  for line in proc.stdout:
    if first_iter is None and line.startswith('iter '):
      first_iter = time.perf_counter() - start  # start-up and iter 0
    if line.startswith('saving checkpoint'):
      # Keep each evaluation's weights, with the time they were reached.
      elapsed = time.perf_counter() - start
      path = os.path.join(repo, 'out', f'ckpt_{len(saved)}.pt')
      saved.append((path, elapsed))
    if line.startswith('iter ') and saved and not os.path.exists(
        saved[-1][0]):
      shutil.copy(os.path.join(repo, 'out', 'ckpt.pt'), saved[-1][0])
  proc.wait()
  wall = time.perf_counter() - start
  if proc.returncode:
    raise RuntimeError(f'nanoGPT exited with {proc.returncode}.')
  if saved and not os.path.exists(saved[-1][0]):
    shutil.copy(os.path.join(repo, 'out', 'ckpt.pt'), saved[-1][0])
  with open(os.path.join(repo, 'score.py'), 'w') as f:
    f.write(_SCORE)
  curve = []
  for path, elapsed in saved:
    out = subprocess.run(
        [sys.executable, 'score.py', path, 'data/bytes/val.bin',
         str(HPARAMS['block_size'])], cwd=repo, check=True,
        capture_output=True, text=True).stdout
    curve.append(dict(json.loads(out.strip().splitlines()[-1]),
                      elapsed_s=elapsed))
  return {'wall_s': wall, 'curve': curve, 'first_step_s': first_iter}


def time_parts(line: str) -> dict[str, float]:
  """The seconds of each part of train.py's closing 'Time: ...' line
  (start-up, compile, steps, evaluation, ...); {} where line is not it."""
  match = re.match(r'Time: [\d.]+ s wall, goodput [\d.]+% \((.*)\)\.', line)
  if not match:
    return {}
  named = (part.rsplit(' ', 2)[:2] for part in match[1].split(', '))
  return {name.replace(' ', '_'): float(seconds) for name, seconds in named}


def run_ours(work: str, steps: int) -> dict:
  """``python train.py`` (the default job) evaluating every EVAL_EVERY
  steps, without the closing sample; the time of each evaluation is when
  its line is printed."""
  workdir = os.path.join(work, 'ours')
  start = time.perf_counter()
  proc = subprocess.Popen(
      [sys.executable, '-u', 'train.py', f'--workdir={workdir}',
       f'--config.num_steps={steps}', f'--config.eval_every={EVAL_EVERY}',
       f'--config.log_every={EVAL_EVERY // 2}',
       '--config.sample.enabled=False'],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  curve, parts, first_step = [], {}, None
  for line in proc.stdout:
    parts = time_parts(line) or parts
    if first_step is None and line.startswith('First step'):
      first_step = time.perf_counter() - start
    match = re.search(r'step (\d+): train loss [\d.]+, eval loss ([\d.]+)',
                      line)
    if match:
      curve.append({'step': int(match[1]), 'val_loss': float(match[2]),
                    'elapsed_s': time.perf_counter() - start})
  proc.wait()
  if proc.returncode:
    raise RuntimeError(f'train.py exited with {proc.returncode}.')
  return {'wall_s': time.perf_counter() - start, 'curve': curve,
          'parts': parts, 'first_step_s': first_step}


def loss_at(curve: list[dict], seconds: float) -> float | None:
  """The last evaluated loss reached within ``seconds`` (None: none was)."""
  reached = [p['val_loss'] for p in curve if p['elapsed_s'] <= seconds]
  return reached[-1] if reached else None


def run(nanogpt_dir: str, steps: int = STEPS, rounds: int = 5
        ) -> list[dict]:
  """A row per round; rounds alternate which side runs first (a machine
  that slows down over the suite's minutes weighs on both alike)."""
  if not os.path.exists(os.path.join(nanogpt_dir, 'model.py')):
    raise UsageError(f'{nanogpt_dir} is not a nanoGPT clone (no model.py); '
                     'git clone https://github.com/karpathy/nanoGPT and '
                     'pass --nanogpt_dir.')
  rows = []
  for r in range(rounds):
    with tempfile.TemporaryDirectory() as work:
      if r % 2:
        ours = run_ours(work, steps)
        nano = run_nanogpt(nanogpt_dir, work, steps)
      else:
        nano = run_nanogpt(nanogpt_dir, work, steps)
        ours = run_ours(work, steps)
    rows.append(dict(_row(ours, nano, steps), round=r))
  return rows


def _row(ours: dict, nano: dict, steps: int) -> dict:
  """One round's row: wall times, losses and where the time went."""
  return {
      'suite': 'nanogpt', 'steps': steps,
      'ours_wall_s': ours['wall_s'], 'nanogpt_wall_s': nano['wall_s'],
      'wall_ratio': ours['wall_s'] / nano['wall_s'],
      'ours_val_loss': ours['curve'][-1]['val_loss'],
      'nanogpt_val_loss': nano['curve'][-1]['val_loss'],
      # Each side's loss when the other finished.
      'ours_val_loss_at_nanogpt_end': loss_at(ours['curve'],
                                              nano['wall_s']),
      'nanogpt_val_loss_at_ours_end': loss_at(nano['curve'],
                                              ours['wall_s']),
      # Where the time goes: from start to the first step's line (ours)
      # or iteration 0's (nanoGPT's), and train.py's own account.
      'ours_first_step_s': ours['first_step_s'],
      'nanogpt_first_step_s': nano['first_step_s'],
      'ours_time_parts_s': ours['parts'],
      'ours_curve': ours['curve'], 'nanogpt_curve': nano['curve'],
  }
