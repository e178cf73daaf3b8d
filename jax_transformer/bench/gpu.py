"""bf16 training throughput and MFU on one accelerator, each item time-boxed.

Items: a GPT-2 small shaped decoder LM (124M, T=1024) and a ~350M decoder
LM (GPT-2 medium's shape), each plain (XLA attention with segment masks)
and with the scaling options (cuDNN attention by 'auto' with lengths, the
chunked loss, scanned layers with remat; the 350M also at batch 32 with
full remat), and the paper's base encoder-decoder with about 25k source +
25k target tokens a step. Each runs in its own subprocess under a
time limit (a hung compile costs one item, not the loan), with a persistent
compilation cache so that a second run skips compiling. Parameters stay
float32 and matmuls run in bfloat16 (``dtype='bfloat16'``), no dropout in
the LMs (as current LM recipes), the paper's 0.1 in the encoder-decoder.

MFU follows ``perf.py``: model FLOPs (6 N per token plus attention, causal
as half) x steps/s over the chip's dense bf16 peak (989 TFLOP/s for
H100/H200), and also over the bf16 matmul rate measured in the same run.

Beside each measured step: the roofline's prediction for the same
executable on this device (``compile/step_model.py``, the target table's
and the planner's model: ``predicted_step_s`` and ``predicted_mfu``, with the
chip's built-in rates on an accelerator, measured ones on CPU host
devices), and ``measured_over_predicted``, so that the first run on
hardware checks the model. The items are the table's small rows on one
chip: ``gpt2_124m`` is ``configs/gpt2_small``'s model, ``gpt2_350m``
``lm_350m``'s shape (at GPT-2's vocabulary), ``transformer_base``
``wmt_base``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import jax
import optax
from flax import nnx

from jax_transformer.bench.step import make_batch
from jax_transformer.compile import step_model
from jax_transformer.model.config import gpt2_small, transformer_base
from jax_transformer.model.families import family
from jax_transformer.model.params import split
from jax_transformer.train import model_setup, perf
from jax_transformer.train import steps as steps_lib

_350M = dict(d_model=1024, num_heads=16, num_decoder_layers=24, d_ff=4096)
# The options of docs/scaling.md, each against the plain
# step: attention as XLA with segment masks vs 'auto' (cuDNN) with lengths,
# the chunked loss, scanned layers and remat.
_PLAIN = dict(attention_implementation='xla')
_FUSED = dict(attention_implementation='auto')
_SCAN = dict(_FUSED, scan_layers=True, remat='dots')
# Items name their model kind (a key of model.families.FAMILIES).
_LM = 'decoder_lm'
ITEMS = {
    'gpt2_124m': dict(kind=_LM, fields=_PLAIN, batch=16, seq=1024),
    'gpt2_124m_fused': dict(kind=_LM, fields=_FUSED, batch=16, seq=1024,
                            packed=False, loss_chunk_size=4096),
    'gpt2_124m_scan_dots': dict(kind=_LM, fields=_SCAN, batch=16, seq=1024,
                                packed=False, loss_chunk_size=4096),
    'gpt2_350m': dict(kind=_LM, fields=dict(_350M, **_PLAIN), batch=8,
                      seq=1024),
    'gpt2_350m_scan_dots': dict(kind=_LM, fields=dict(_350M, **_SCAN),
                                batch=8, seq=1024, packed=False,
                                loss_chunk_size=4096),
    'gpt2_350m_scan_full_b32': dict(
        kind=_LM, fields=dict(_350M, **dict(_SCAN, remat='full')),
        batch=32, seq=1024, packed=False, loss_chunk_size=4096),
    'transformer_base': dict(kind='encoder_decoder', fields=dict(), batch=96,
                             seq=256),
}


def measure(name: str, steps: int, seconds: float) -> dict:
  """One item, in this process: compile, warm up, time up to ``steps``
  steps or ``seconds``, whichever comes first."""


  item = ITEMS[name]
  record = family(item['kind'])
  if record.has_source:  # the paper's base model, sources as long as targets
    config = transformer_base(dtype='bfloat16', **item['fields'])
    src_len = item['seq']
  else:
    config = gpt2_small(dtype='bfloat16', dropout_rate=0.0,
                        attention_dropout_rate=0.0, **item['fields'])
    src_len = 0
  case = dict(config=config, kind=item['kind'], batch=item['batch'],
              src_len=src_len, tgt_len=item['seq'])
  model_def, params = split(record.model_class(config, nnx.Rngs(0)))
  tx = optax.adamw(1e-4)
  state = model_setup.train_state(params, tx)
  batch = jax.device_put(make_batch(case))
  step = steps_lib.make_train_step(
      model_def, tx, packed=item.get('packed', True),
      loss_chunk_size=item.get('loss_chunk_size', 0))
  train, compile_s = perf.compile_timed(jax.jit(step, donate_argnums=0),
                                        state, batch)
  for _ in range(2):
    state, metrics = train(state, batch)
  jax.block_until_ready(metrics)
  start, done = time.perf_counter(), 0
  while done < steps and time.perf_counter() - start < seconds:
    state, metrics = train(state, batch)
    done += 1
  jax.block_until_ready(metrics)
  step_s = (time.perf_counter() - start) / done
  flops = perf.step_flops(config, item['batch'], src_len, item['seq'])
  device = jax.devices()[0]
  matmul = perf.matmul_rate()
  peak = perf.peak_flops(device.device_kind)
  tokens = item['batch'] * (item['seq'] + src_len)
  stats = device.memory_stats() or {}
  row = dict(suite='gpu', model=name, device=device.device_kind,
             options=dict(item['fields'], packed=item.get('packed', True),
                          loss_chunk_size=item.get('loss_chunk_size', 0)),
             batch=item['batch'], seq=item['seq'], src_len=src_len,
             params_m=sum(v.size for v in params.values()) / 1e6,
             compile_s=compile_s, timed_steps=done, step_s=step_s,
             tokens_per_s=tokens / step_s,
             model_tflops_per_s=flops['train'] / step_s / 1e12,
             matmul_tflops_per_s=matmul / 1e12,
             mfu_vs_matmul=flops['train'] / step_s / matmul,
             peak_memory_gb=stats.get('peak_bytes_in_use', 0) / 1e9)
  if peak:
    row['mfu'] = flops['train'] / step_s / peak
    row['peak_tflops'] = peak / 1e12
  row.update(predicted(train, config, item, src_len, flops['train']))
  row['measured_over_predicted'] = step_s / row['predicted_step_s']
  return row


def predicted(compiled, config, item: dict, src_len: int,
              model_flops: float) -> dict:
  """The step model's figures for this compiled step on this device."""
  rates = step_model.Rates.of_devices(jax.devices()[:1])
  kernel = step_model.ATTENTION_KERNEL_TRAIN * perf.attention_flops(
      config, item['batch'], src_len, item['seq'])
  cost = step_model.StepCost.of(compiled, kernel)
  figures = step_model.predict(cost, rates, 1, model_flops, 1)
  return dict(predicted_step_s=figures['predicted_step_s'],
              predicted_mfu=figures['predicted_mfu'], rates=rates.name,
              predicted_parts_s={k: figures[k] for k in
                                 ('compute_s', 'hbm_s', 'link_s')})


def run(items=tuple(ITEMS), steps: int = 20, seconds_per_item: float = 42,
        cache_dir: str | None = None) -> list[dict]:
  """Each item in a subprocess with a time limit (all seven default items
  within 5 minutes); a failed or timed-out item gives a row saying so."""
  env = dict(os.environ)
  # The directory train.py caches in by default.
  env['JAX_COMPILATION_CACHE_DIR'] = cache_dir or os.path.expanduser(
      os.path.join('~', '.cache', 'jax_transformer', 'xla'))
  env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  rows = []
  for name in items:
    code = ('import json, sys; from jax_transformer.bench import gpu; '
            f'print(json.dumps(gpu.measure({name!r}, {steps}, '
            f'{seconds_per_item / 3})))')
    try:
      out = subprocess.run([sys.executable, '-c', code], env=env,
                           capture_output=True, text=True,
                           timeout=seconds_per_item)
      if out.returncode:
        rows.append(dict(suite='gpu', model=name,
                         error=out.stderr.strip().splitlines()[-1:]))
      else:
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    except subprocess.TimeoutExpired:
      rows.append(dict(suite='gpu', model=name,
                       error=f'timed out after {seconds_per_item} s'))
  return rows
