"""A run's train step lowered and compiled ahead of time, never run.

The state and the batch are abstract (shapes, dtypes and shardings), so a
CPU host can prove that a pod-sized config shards, compiles and fits:
``jax.jit(...).lower(...).compile()`` on a mesh of
``--xla_force_host_platform_device_count`` CPU devices gives XLA's compile
time and its per-device memory figure for exactly the step ``train.py``
would run (see ``scripts/compile_at_size.py``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections

from jax_transformer.data import batching
from jax_transformer.model import sharding
from jax_transformer.train import checks, experiment, memory, perf, steps


@dataclasses.dataclass(frozen=True)
class Proof:
  """What compiling one config's train step showed."""
  num_params: int
  compile_s: float
  instructions: int               # in the optimized HLO: grows with depth
                                  # unrolled, not scanned
  estimate: memory.Footprint      # before compiling, per device
  xla: memory.Compiled | None     # XLA's figure, per device


def abstract_batch(cfg: ml_collections.ConfigDict,
                   mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The shapes and shardings of one global batch of this config."""
  if cfg.model_kind == 'decoder_lm':
    layout = batching.lm_layout(cfg.seq_len)
  else:
    layout = batching.translation_layout(
        cfg.data.get('src_len') or cfg.seq_len, cfg.seq_len)
  placed = sharding.batch_sharding(mesh)
  return {key: jax.ShapeDtypeStruct((cfg.batch_size, group.length),
                                    jnp.int32, sharding=placed)
          for group in layout
          for key in (*group.features, group.segment_key,
                      group.position_key)}


def prove(cfg: ml_collections.ConfigDict, vocab_size: int,
          devices=None) -> Proof:
  """Lowers and compiles cfg's train step on a mesh of ``devices`` (default
  all), with vocab_size standing in for the tokenizer's. Nothing is
  allocated on the devices."""
  checks.check_run_fields(cfg)
  setup = experiment.setup(cfg, vocab_size)
  mesh = sharding.make_mesh(cfg.mesh, devices)
  sharding.check_batch(cfg.batch_size, mesh)
  abstract_state = setup.abstract_state(cfg.seed)
  shardings, _ = steps.state_shardings(setup, mesh, abstract_state)
  state = steps.sharded_abstract(abstract_state, shardings)
  step = steps.jit_train_step(cfg, setup, mesh, shardings)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    compiled, seconds = perf.compile_timed(step, state,
                                           abstract_batch(cfg, mesh))
  return Proof(
      num_params=sum(x.size for x in setup.abstract_params.values()),
      compile_s=seconds,
      instructions=compiled.as_text().count(' = '),
      estimate=memory.estimate(cfg, setup.model_config, abstract_state,
                               shardings, mesh),
      xla=memory.Compiled.of(compiled))
