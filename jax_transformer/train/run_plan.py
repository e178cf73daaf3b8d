"""A run put together once: from an experiment and a mesh, everything
static about it.

The trainer, ``compile.lowering`` (``train.py --aot_target``,
``compile_at_size.py --target``, the planner's compiles) and the importer
all start here, so what a target's compiler proves is what a run runs: the
same model setup, the same sharded abstract state, the same jitted steps,
the same memory estimate.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
from jax.sharding import Mesh

from jax_transformer import data
from jax_transformer.experiment import Experiment
from jax_transformer.model import attention, sharding
from jax_transformer.runtime import devices as jax_devices
from jax_transformer.train import memory, model_setup, steps


@dataclasses.dataclass(frozen=True, eq=False)
class RunPlan:
  """What a run is before any data or step.

  exp: the experiment (typed); mesh: its devices; setup: model, abstract
  parameters, schedule and optimizer; abstract_state: the train state as
  ShapeDtypeStructs; shardings / param_specs: where each leaf of it lives
  (``steps.state_shardings``); estimate: the memory per device it needs,
  before compiling.
  """
  exp: Experiment
  mesh: Mesh
  setup: model_setup.Setup
  abstract_state: dict[str, Any]
  shardings: dict[str, Any]
  param_specs: dict[str, Any]
  estimate: memory.Footprint

  @property
  def sharded_state(self) -> dict[str, Any]:
    """The abstract state with its shardings (for lowering and restoring)."""
    return steps.sharded_abstract(self.abstract_state, self.shardings)

  def train_step(self):
    """The jitted train step (state donated); call or lower it with the
    mesh in context (``steps.traced_under``)."""
    return steps.jit_train_step(self.exp.optim, bool(self.exp.data.pack),
                                self.exp.loss_chunk_size, self.setup,
                                self.mesh, self.shardings)

  def eval_step(self):
    """The jitted eval step over the sharded parameters."""
    return steps.jit_eval_step(self.exp.loss_chunk_size, self.setup,
                               self.mesh, self.shardings)

  def fresh_state(self) -> dict[str, Any]:
    """A new train state, made already sharded."""
    return jax.jit(lambda: self.setup.init_state(self.exp.seed),
                   out_shardings=self.shardings)()


def checked(exp: Experiment) -> Experiment:
  """exp after its fields' checks (``Experiment.check``) and its
  data's (``data.check_config``: the dataset it names, a 'files' glob
  that matches nothing, its mixture, its tokenizer_path); all before any
  data is prepared."""
  exp.check()
  data.check_config(exp.data)
  return exp


def mesh_for(exp: Experiment, devices=None) -> Mesh:
  """exp's mesh over devices (default all), after refusing in one
  sentence a model or a mesh that cannot work (before any data is
  prepared: the vocabulary is not known yet, a stand-in size checks the
  rest), accelerators that are not there, or batches and rows the mesh
  cannot split."""
  exp.model_config(1)
  if devices is None:
    jax_devices.check_accelerators(exp.mesh.sizes)
  mesh = sharding.make_mesh(exp.mesh.sizes, devices)
  for size in (exp.batch_size, exp.eval_batch_size):
    sharding.check_batch(size, mesh)
  check_rows(exp, mesh)
  return mesh


def check_rows(exp: Experiment, mesh: Mesh) -> None:
  """Refuses in one sentence rows whose positions the mesh's 'sequence'
  axis does not split evenly (target and, for an encoder-decoder,
  source)."""
  sharding.check_length(exp.seq_len, mesh)
  if exp.source_len:
    sharding.check_length(exp.source_len, mesh, 'data.src_len')


def build(exp: Experiment, mesh: Mesh, vocab_size: int,
          setup: model_setup.Setup | None = None,
          platform: str | None = None,
          abstract_state: dict[str, Any] | None = None) -> RunPlan:
  """The plan of exp on mesh with a
  tokenizer of vocab_size ids; ``setup`` reuses one built for exp's model
  and optimizer; ``platform`` ('tpu', 'gpu'): the memory estimate counts
  the attention that platform's compiler would run ('auto'), where the
  run is compiled for a target; ``abstract_state`` reuses setup's (the
  planner sizes many layouts of one setup). Refuses in one sentence parameters the
  mesh cannot split."""
  setup = setup or model_setup.build(exp, vocab_size)
  if abstract_state is None:
    abstract_state = setup.abstract_state(exp.seed)
  shardings, param_specs = steps.state_shardings(setup, mesh, abstract_state)
  with (attention.compiling_for(platform) if platform
        else contextlib.nullcontext()):
    estimate = memory.estimate(exp.step_shape, exp.loss_chunk_size,
                               setup.model_config, abstract_state,
                               shardings, mesh)
  return RunPlan(exp, mesh, setup, abstract_state, shardings, param_specs,
                 estimate)
