"""LoRA's train step against full fine-tuning's, same model, one process.

The model, batch and optimizer are ``finetune:gpt2_shakespeare``'s (GPT-2
small, 8 x 256 tokens, AdamW with clipping) at random weights (a step's
time does not depend on them); the LoRA side adds the config's adapters
at ``config.lora.rank=8`` (as its docstring suggests: query, key, value
and out). Both steps are the trainer's (``steps.make_train_step`` on
``model_setup.build``'s Setup, the state donated), compiled apart, then
timed in interleaved rounds (``timing.interleave``), each step blocked on
before the clock is read.

The row: each side's median seconds, the median of per-round ratios
lora / full (the goal of issue 38: at most 0.75; on a GPU or TPU as on
CPUs, LoRA skips the frozen kernels' weight gradients and their optimizer
update, about a third of a full step's matmuls), and each compiled step's
memory on one device from XLA (``memory.Compiled``: arguments, outputs
and temporaries, donated buffers once).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jax_transformer.bench import timing
from jax_transformer.bench.step import make_batch
from jax_transformer.experiment import Experiment, doors
from jax_transformer.model import lora
from jax_transformer.train import memory, model_setup, perf, steps

CONFIG = 'finetune:gpt2_shakespeare'
RANK = 8
GOAL = 0.75  # LoRA's step over the full step's, at most
GPT2_VOCAB = 50257


def _side(exp: Experiment, vocab: int):
  """(jitted train step, its fresh state) of one experiment."""
  setup = model_setup.build(exp, vocab)
  state = jax.jit(lambda: setup.init_state(exp.seed))()
  step = steps.make_train_step(
      setup.model_def, setup.tx, exp.optim.label_smoothing,
      exp.optim.z_loss, packed=bool(exp.data.pack),
      loss_chunk_size=exp.loss_chunk_size)
  return jax.jit(step, donate_argnums=0), state


def _runner(compiled, state, batch):
  """A call of one train step, blocked until ready, over a state it
  carries along (the step donates the state it is given)."""
  holder = {'state': state}

  def call():
    holder['state'], metrics = compiled(holder['state'], batch)
    jax.block_until_ready(metrics)

  return call


def run(rounds: int = 5, config: str = CONFIG, rank: int = RANK,
        vocab: int = GPT2_VOCAB, **overrides: Any) -> list[dict]:
  """One row (see the module docstring). overrides: top-level fields
  (seq_len, batch_size) or model fields (``model={'d_model': 64}``) of
  the config, for a smaller run."""
  exp = doors.load(config)
  # All model fields at once: each is checked against the others.
  model = dataclasses.replace(exp.model, **overrides.pop('model', {}))
  full_exp = exp.replace(model=model, **overrides, **{'lora.rank': 0})
  lora_exp = full_exp.replace(**{'lora.rank': rank})
  case = dict(config=full_exp.model_config(vocab), kind=full_exp.model_kind,
              batch=full_exp.batch_size, src_len=0, tgt_len=full_exp.seq_len)
  batch = jax.device_put(make_batch(case))
  sides, row = {}, {}
  for name, exp in (('full', full_exp), ('lora', lora_exp)):
    jitted, state = _side(exp, vocab)
    compiled, row[f'{name}_compile_s'] = perf.compile_timed(jitted, state,
                                                            batch)
    stats = memory.Compiled.of(compiled)
    row[f'{name}_memory_gb'] = stats and stats.total / 1e9
    trained, total = lora.count(state['params'])
    row[f'{name}_trainable_m'] = trained / 1e6
    row['params_m'] = (total - (trained if name == 'lora' else 0)) / 1e6
    sides[name] = _runner(compiled, state, batch)
  load = timing.load_average()
  times = timing.interleave(sides, rounds)
  out = dict(suite='lora', model=config, step='train',
             batch=full_exp.batch_size, seq_len=full_exp.seq_len,
             rank=rank, targets=lora_exp.lora.targets,
             **timing.summary(times, 'lora', 'full'), **row,
             load_before=load, load_after=timing.load_average(),
             device=jax.devices()[0].device_kind, goal=GOAL)
  out['meets_goal'] = out['ratio'] <= GOAL
  return [out]
