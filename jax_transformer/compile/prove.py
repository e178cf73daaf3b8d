"""Proof at size on a CPU host: a run's train step lowered
(``lowering.lower_train``) and compiled on a mesh of
``--xla_force_host_platform_device_count`` CPU devices, never run. It
gives XLA's compile time and per-device memory for exactly the step
``train.py`` would run, and the optimized program's size, which grows
with depth unrolled and not scanned (``scripts/compile_at_size.py``
without ``--target``).
"""

from __future__ import annotations

import dataclasses
import time

from jax_transformer.compile import lowering
from jax_transformer.train import memory


@dataclasses.dataclass(frozen=True)
class Proof:
  """What compiling one config's train step showed."""
  num_params: int
  compile_s: float                # lowering and compiling
  instructions: int               # in the optimized HLO: grows with depth
                                  # unrolled, not scanned
  estimate: memory.Footprint      # before compiling, per device
  xla: memory.Compiled | None     # XLA's figure, per device


def prove(run: lowering.TrainLowering) -> Proof:
  """Compiles a lowered train step (``lowering.lower_here``: a config's
  step on a mesh of this host's devices, with a stand-in vocabulary).
  Nothing is allocated on the devices."""
  start = time.perf_counter()
  compiled = run.lowered.compile()
  return Proof(
      num_params=sum(x.size for x in run.setup.abstract_params.values()),
      compile_s=run.lower_s + time.perf_counter() - start,
      instructions=compiled.as_text().count(' = '),
      estimate=run.estimate,
      xla=memory.Compiled.of(compiled))
