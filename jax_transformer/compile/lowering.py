"""A run's train step lowered for a mesh of devices, never run.

The state and the batch are abstract (shapes, dtypes and shardings), so a
host of any kind lowers the step exactly as ``train.py`` would run it on
those devices: CPU host devices (``prove.py``), a target's compile-only
TPU or GPU devices (``report.py``), the planner's candidates
(``plan/search.py``). ``lower_train`` is the one function that does it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp

from jax_transformer.data import batching, files
from jax_transformer.experiment import Experiment
from jax_transformer.model import attention, families, sharding
from jax_transformer.runtime import targets
from jax_transformer.train import memory, model_setup, run_plan


def abstract_batch(cfg: Experiment,
                   mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The shapes and shardings of one global batch of this config (with a
  loss_mask where the run reads instruction data)."""
  if families.family(cfg.model_kind).has_source:
    layout = batching.translation_layout(cfg.source_len, cfg.seq_len)
  else:
    layout = (batching.instruction_layout(cfg.seq_len)
              if _reads_instructions(cfg) else batching.lm_layout(cfg.seq_len))
  placed = sharding.batch_sharding(mesh)
  return {key: jax.ShapeDtypeStruct((cfg.batch_size, group.length),
                                    jnp.int32, sharding=placed)
          for group in layout
          for key in (*group.features, group.segment_key,
                      group.position_key)}


def _reads_instructions(cfg: Experiment) -> bool:
  """data.direction=prompt-completion: from the config alone, since the
  files a run reads need not be on the host that compiles for it."""
  direction = cfg.data.direction
  return (isinstance(direction, str)
          and files.is_instruction(direction.split('-')))


def lower(jitted, args, mesh, platform: str) -> jax.stages.Lowered:
  """jitted lowered for args as the platform's compiler would get it (its
  attention kernel, the mesh's activation constraints)."""
  with attention.compiling_for(platform), \
      jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return jitted.lower(*args)


@dataclasses.dataclass
class TrainLowering:
  """A run's train step lowered for a mesh of devices, with what the
  report needs of the run."""
  lowered: jax.stages.Lowered
  lower_s: float
  plan: run_plan.RunPlan
  batch: dict[str, Any]          # ShapeDtypeStructs with shardings

  @property
  def setup(self) -> model_setup.Setup:
    return self.plan.setup

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self.plan.mesh

  @property
  def shardings(self) -> dict[str, Any]:
    return self.plan.shardings

  @property
  def state(self) -> dict[str, Any]:
    """The abstract train state with its shardings."""
    return self.plan.sharded_state

  @property
  def estimate(self) -> memory.Footprint:
    return self.plan.estimate


def lower_here(cfg: Experiment, vocab_size: int, devices=None
               ) -> TrainLowering:
  """cfg's train step lowered on a mesh of this host's ``devices``
  (default all), for the kernels their platform runs."""
  devices = list(devices or jax.devices())
  return lower_train(cfg, devices,
                     targets.kernel_platform(devices[0].platform), vocab_size)


def lower_train(cfg: Experiment, devices: list,
                platform: str, vocab_size: int = 32768,
                setup: model_setup.Setup | None = None) -> TrainLowering:
  """cfg's train step lowered on a mesh of devices for platform ('tpu',
  'gpu' or 'cpu'), and the pre-flight estimate (``setup`` reuses one
  built for cfg's model and optimizer)."""
  cfg = run_plan.checked(cfg)
  mesh = sharding.make_mesh(cfg.mesh.sizes, devices)
  sharding.check_batch(cfg.batch_size, mesh)
  run_plan.check_rows(cfg, mesh)
  plan = run_plan.build(cfg, mesh, vocab_size, setup, platform)
  batch = abstract_batch(cfg, mesh)
  start = time.perf_counter()
  lowered = lower(plan.train_step(), (plan.sharded_state, batch), mesh,
                  platform)
  return TrainLowering(lowered, time.perf_counter() - start, plan, batch)
