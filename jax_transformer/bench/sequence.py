"""The sequence axis against tensor parallelism on CPU host devices: a
train step's time and memory as rows grow.

Two rows of a small decoder LM (``MODEL``: d_model 256, 8 heads, 2
layers, rotary positions) on 8 host devices, each layout the trainer's
own step (``steps.make_train_step``, the state donated, laid out by
``steps.state_shardings``):

* ``tensor``: fsdp 2 x tensor 4, rows whole, heads and the MLP split;
* ``sequence``: fsdp 2 x sequence 4, each row's positions split, keys
  and values gathered for attention.

Two rows cannot spread over 8 devices by the batch alone; these are the
two ways to use the other 4. Per ``seq_len`` (``SEQ_LENS``), interleaved
rounds (``timing.interleave``, each step blocked on): the median seconds
of each, the median per-round ratio sequence / tensor, and each compiled
step's memory on one device from XLA. Host devices share the machine's
cores, so the times say what the layouts compute and move on one CPU, not
what they take on a pod (``docs/scaling.md`` has the step model's
predictions for those, labelled).
"""

from __future__ import annotations

from typing import Any

import jax

from jax_transformer.bench import timing
from jax_transformer.bench.lora import _runner
from jax_transformer.bench.step import make_batch
from jax_transformer.experiment import doors
from jax_transformer.model import sharding
from jax_transformer.train import memory, model_setup, perf, steps

CONFIG = 'lm_shakespeare:tiny'
MODEL = {'d_model': 256, 'num_heads': 8, 'num_kv_heads': 8, 'd_ff': 1024,
         'num_decoder_layers': 2, 'positional': 'rotary',
         'dropout_rate': 0.0}
ROWS = 2
SEQ_LENS = (512, 1024, 2048, 4096)
LAYOUTS = {'tensor': {'data': 1, 'fsdp': 2, 'sequence': 1, 'tensor': 4},
           'sequence': {'data': 1, 'fsdp': 2, 'sequence': 4, 'tensor': 1}}
VOCAB = 256


def _side(seq_len: int, mesh_sizes: dict[str, int]):
  """(compiled step, fresh state on the mesh, batch, memory) of a layout."""
  exp = doors.load(CONFIG)
  exp = exp.replace(seq_len=seq_len, batch_size=ROWS,
                    **{f'model.{k}': v for k, v in MODEL.items()},
                    **{'model.max_len': seq_len},
                    **{f'mesh.{k}': v for k, v in mesh_sizes.items()})
  setup = model_setup.build(exp, VOCAB)
  mesh = sharding.make_mesh(exp.mesh.sizes, jax.devices()[:8])
  shardings, _ = steps.state_shardings(setup, mesh,
                                       setup.abstract_state(exp.seed))
  state = jax.jit(lambda: setup.init_state(exp.seed),
                  out_shardings=shardings)()
  step = steps.make_train_step(setup.model_def, setup.tx,
                               exp.optim.label_smoothing, exp.optim.z_loss)
  case = dict(config=exp.model_config(VOCAB), kind=exp.model_kind,
              batch=ROWS, src_len=0, tgt_len=seq_len)
  batch = jax.device_put(make_batch(case), sharding.batch_sharding(mesh))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    jitted = jax.jit(step, in_shardings=(shardings,
                                         sharding.batch_sharding(mesh)),
                     donate_argnums=0)
    compiled, compile_s = perf.compile_timed(jitted, state, batch)
  return compiled, state, batch, memory.Compiled.of(compiled), compile_s


def run(rounds: int = 5, seq_lens: tuple[int, ...] = SEQ_LENS
        ) -> list[dict[str, Any]]:
  """One row per seq_len (see the module docstring)."""
  if len(jax.devices()) < 8:
    raise ValueError('the sequence suite needs 8 devices (CPU: '
                     'XLA_FLAGS=--xla_force_host_platform_device_count=8)')
  rows = []
  for seq_len in seq_lens:
    sides, row = {}, {}
    for name, sizes in LAYOUTS.items():
      compiled, state, batch, stats, compile_s = _side(seq_len, sizes)
      row[f'{name}_compile_s'] = compile_s
      row[f'{name}_memory_gb'] = stats and stats.total / 1e9
      sides[name] = _runner(compiled, state, batch)
    load = timing.load_average()
    times = timing.interleave(sides, rounds)
    rows.append(dict(suite='sequence', model=CONFIG, step='train',
                     shape=f'{ROWS}x{seq_len}', batch=ROWS, seq_len=seq_len,
                     **timing.summary(times, 'sequence', 'tensor'), **row,
                     load_before=load, load_after=timing.load_average(),
                     device=jax.devices()[0].device_kind))
  return rows
