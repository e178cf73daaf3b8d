"""A train step's time predicted from its compiled executable.

Per chip, from the optimized HLO and XLA's cost analysis of one step:

* ``flops``: XLA's FLOPs, which count each loop body once, scaled to the
  step by the ratio of the matmuls' FLOPs per step (each body times its
  trips, a rematerialized matmul each time it runs) to their FLOPs with
  each body once (``hlo_stats.dot_flops``); plus a fused attention
  kernel's (a custom call XLA cannot see into: 3.5x attention's forward
  FLOPs, the backward's four matmuls and its recomputed scores);
* ``hbm_bytes``: XLA's bytes accessed, scaled likewise by the kernels'
  bytes per step over their bytes with each body once
  (``hlo_stats.memory_bytes``); ``exposed_hbm_bytes`` the share of them
  moved by kernels that do no matmul (``hlo_stats.bytes_without_math``);
* ``link_bytes``: the collectives' bytes per step (an all-reduce twice;
  a TPU's transfers between slices too), in ``link_classes`` by whether
  the schedule puts math between each collective's start and done
  (``async``) or not (``sync``), and whether it crosses the network
  between hosts or slices (``_cross``: ``hlo_stats.collective_links``).

Against one chip's rates (cost version 9)::

    compute_s  = max(flops, the model's FLOPs) / peak FLOP/s
    hbm_s      = hbm_bytes / HBM bytes per s
    exposed    = exposed_hbm_bytes / HBM bytes per s
    link_s     = chip-to-chip bytes / link rate + crossing bytes / network
                 rate + collectives x latency;  sync_s, async_s its parts
    kernels_s  = max(compute_s, hbm_s - exposed) + exposed
    step_s     = max(kernels_s, f x async_s) + (1 - f) x async_s + sync_s
                                                 accelerators
               = compute_s + hbm_s + link_s      CPU host devices
    update_s   = grad_accum_steps x step_s       (predicted_step_s)

with f the stated share of an asynchronous collective's time that hides
behind the kernels between its start and done (``Rates.collective_overlap``,
0.75 unless overridden: an assumption, not a measurement). Kernels run one
after another: a matmul kernel's HBM traffic hides behind its own math,
and a kernel that does no matmul (a norm, an activation, a residual add,
a layout change) takes its traffic's time in full. A synchronous
collective stops the chip for its whole time. So of two layouts that do
the same FLOPs, the one that moves more bytes between kernels or over the
links is predicted slower. The MFU the model predicts is the model's
FLOPs of an update at peak (``perf.step_flops``) over update_s: a
prediction, not a bound that no run can beat (the overlap share and the
per-kernel rates are assumptions), to be checked against measured steps
(``benchmark.py --suite plan``, ``--suite gpu``). Host devices run each
part in turn on the same cores, so there the parts add.

This is the one step-time model: the target report's figures
(``report.py``, ``scripts/compile_at_size.py --target``) and the planner
(``plan/search.py``) both take them from ``predict`` of ``StepCost.of``
one executable, with the FLOPs of ``kernel_flops`` and ``update_flops``;
``figures`` is the two in one call. ``COST_VERSION`` names the model
(docs/planning.md has a table of its versions).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.compile import hlo_stats
from jax_transformer.experiment import StepShape
from jax_transformer.model import sharding
from jax_transformer.runtime import targets
from jax_transformer.train import memory, perf

ATTENTION_KERNEL_TRAIN = 3.5  # x forward attention FLOPs in a fused kernel
# The step model's version: part of the planner's cache key, and named in
# every table of predictions (docs/planning.md: what each version changed).
COST_VERSION = 9
# The share of an asynchronous collective's time that hides behind the
# kernels the schedule puts between its start and done: stated, not
# measured (NCCL's kernels take SMs from the matmuls; a TPU's transfers
# share HBM with them).
COLLECTIVE_OVERLAP = 0.75


@dataclasses.dataclass(frozen=True)
class Rates:
  """One chip's rates, and whether a step's parts overlap on it.
  ``network_bytes_per_s`` is the chip's share of the network between
  hosts (GPUs) or slices (TPUs, DCN), which a collective crossing them
  moves its bytes at; ``collective_overlap`` the share of an asynchronous
  collective's time that hides behind kernels."""
  name: str
  peak_flops: float
  hbm_bytes_per_s: float
  link_bytes_per_s: float
  memory_bytes: int | None
  overlap: bool = True
  collective_latency_s: float = 0.0
  network_bytes_per_s: float | None = None
  collective_overlap: float = COLLECTIVE_OVERLAP

  @classmethod
  def of_target(cls, target: targets.Target,
                network_bytes_per_s: float | None = None) -> 'Rates':
    """Vendor figures of the target's chip (``runtime/targets.py``); the
    network's rate per chip that target gives (``targets.network_rate``)
    unless given."""
    chip = targets.CHIPS[target.chip]
    return cls(target.name, perf.peak_flops(chip.kind), chip.hbm_bytes_per_s,
               chip.link_bytes_per_s, memory.builtin_memory(chip.kind),
               network_bytes_per_s=(network_bytes_per_s
                                    or targets.network_rate(target)))

  @classmethod
  def of_devices(cls, devices: list) -> 'Rates':
    """The rates of the devices at hand: built in for accelerators,
    measured on CPU host devices (which share the host's cores: each gets
    its share of the host's matmul, copy and collective rates)."""
    kind = devices[0].device_kind
    peak = perf.peak_flops(kind)
    if peak is not None:
      for t in targets.TARGETS.values():
        if targets.CHIPS[t.chip].kind.lower() in kind.lower():
          return dataclasses.replace(cls.of_target(t), name=kind)
    return measure_host(devices)


def measure_host(devices: list, repeats: int = 5) -> Rates:
  """Rates of CPU host devices, measured: a 1024 x 1024 matmul, an add
  over 4 MB (the size of a small model's activations, which stay in the
  host's caches as a step's kernels pass over them), and an all-gather of
  8 MB per device (and of 4 bytes, for the latency), each the best of
  ``repeats``."""
  n = len(devices)
  with jax.default_device(devices[0]):
    matmul = perf.matmul_rate(1024, jnp.float32, repeats)
    x = jnp.ones(2 ** 20, jnp.float32)
    add = jax.jit(lambda a: a + 1)
    copy = 2 * x.nbytes / _best(lambda: add(x), repeats)
  mesh = jax.sharding.Mesh(np.asarray(devices), ('d',))
  gather = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh,
                                                            PartitionSpec()))

  def sharded(size):
    return jax.device_put(jnp.ones(size * n, jnp.float32),
                          NamedSharding(mesh, PartitionSpec('d')))
  big, tiny = sharded(2 * 2 ** 20), sharded(1)
  latency = _best(lambda: gather(tiny), repeats)
  # Each device receives the n - 1 shards it lacks, all at once: the rate
  # is each one's already.
  link = (n - 1) * big.nbytes / n / max(
      _best(lambda: gather(big), repeats) - latency, 1e-9)
  return Rates(f'{n} x {devices[0].device_kind}', matmul / n, copy / n,
               link, None, overlap=False, collective_latency_s=latency)


def _best(fn, repeats: int) -> float:
  jax.block_until_ready(fn())
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def xla_cost(compiled) -> dict[str, float]:
  """XLA's cost analysis of a compiled step (empty where it has none)."""
  try:
    cost = compiled.cost_analysis()
  except (NotImplementedError, jax.errors.JaxRuntimeError):
    return {}
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return dict(cost or {})


def islands(devices) -> list[int]:
  """Per partition (the mesh's devices in order), the host (GPUs) or the
  slice (TPUs) it is on, numbered from 0: collectives between different
  ones cross the network (all 0 where there is one)."""
  flat = list(getattr(devices, 'flat', devices))
  kind, n = sharding.granules(flat)
  if n == 1:
    return [0] * len(flat)
  key = ((lambda d: d.slice_index) if kind == 'slice'
         else (lambda d: d.process_index))
  order = {k: i for i, k in enumerate(sorted({key(d) for d in flat}))}
  return [order[key(d)] for d in flat]


@dataclasses.dataclass(frozen=True)
class StepCost:
  """What one train step asks of each chip, from its executable."""
  flops: float
  hbm_bytes: float
  link_bytes: float
  collectives: int
  collective_bytes: dict[str, int]
  attention_kernels: list[str]
  # Cost version 9: HBM bytes no matmul hides; link bytes by class
  # (hlo_stats.LINK_CLASSES). Absent (as in tests that build a cost by
  # hand): every HBM byte hidden, every link byte synchronous and local.
  exposed_hbm_bytes: float = 0.0
  link_classes: dict[str, float] | None = None

  @classmethod
  def of(cls, compiled, attention_train_flops_per_chip: float,
         islands: list[int] | None = None) -> 'StepCost':
    """The compiled step's cost; attention_train_flops_per_chip counts
    toward it when a fused attention kernel hides them from XLA; islands
    (``islands``) say which collectives cross the network."""
    hlo = compiled.as_text()
    cost = xla_cost(compiled)
    flops, flops_once = hlo_stats.dot_flops(hlo)
    moved, moved_once = hlo_stats.memory_bytes(hlo)
    # XLA's figures count each loop body once: scaled to the step by the
    # matmuls' (FLOPs) and the kernels' (bytes) ratio of per step to once.
    if cost.get('flops') and flops_once:
      flops = cost['flops'] * flops / flops_once
    hbm = cost.get('bytes accessed', moved_once) * (
        moved / moved_once if moved_once else 1.0)
    exposed = hbm * hlo_stats.bytes_without_math(hlo) / moved if moved \
        else 0.0
    kernels = hlo_stats.attention_kernels(hlo)
    if kernels:
      flops += attention_train_flops_per_chip
    collective = hlo_stats.collective_bytes(hlo)
    classes = hlo_stats.collective_links(hlo, islands)
    return cls(flops, hbm, sum(classes.values()),
               hlo_stats.collective_launches(hlo), collective, kernels,
               exposed, classes)

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def update_flops(shape: StepShape, grad_accum_steps: int,
                 model_config) -> float:
  """The model's FLOPs of one optimizer update (grad_accum_steps steps of
  ``shape``), all chips together."""
  return perf.step_flops(model_config,
                         shape.batch_size * grad_accum_steps,
                         shape.source_len, shape.seq_len)['train']


def kernel_flops(shape: StepShape, model_config, chips: int) -> float:
  """FLOPs per chip of one train step of ``shape`` that a fused attention
  kernel hides from XLA (counted toward the step where the HLO calls
  one)."""
  return ATTENTION_KERNEL_TRAIN * perf.attention_flops(
      model_config, shape.batch_size, shape.source_len,
      shape.seq_len) / chips


def predict(cost: StepCost, rates: Rates, grad_accum_steps: int,
            model_flops_per_update: float, chips: int) -> dict[str, float]:
  """The step's parts in seconds, the step's time, the predicted time of
  one optimizer update (grad_accum_steps steps), the MFU it predicts, and
  the share of the step the links take (``link_share``: all link time
  over the step's; ``exposed_link_s`` what of it the model does not hide).
  The formula is the module's docstring's."""
  # At least the model's own FLOPs: XLA's count of a kernel can fall
  # short of them (a causal block it skips, a matmul it writes another way).
  model_per_step = model_flops_per_update / grad_accum_steps / chips
  compute = max(cost.flops, model_per_step) / rates.peak_flops
  hbm = cost.hbm_bytes / rates.hbm_bytes_per_s
  exposed_hbm = min(cost.exposed_hbm_bytes / rates.hbm_bytes_per_s, hbm)
  classes = cost.link_classes or {'sync': cost.link_bytes}
  network = rates.network_bytes_per_s or rates.link_bytes_per_s

  def seconds(moved: float, cross: bool) -> float:
    # One device moves nothing (and its measured link rate is 0).
    return moved / (network if cross else rates.link_bytes_per_s) \
        if moved else 0.0
  latency = cost.collectives * rates.collective_latency_s
  sync = (seconds(classes.get('sync', 0.0), False)
          + seconds(classes.get('sync_cross', 0.0), True) + latency)
  asynchronous = (seconds(classes.get('async', 0.0), False)
                  + seconds(classes.get('async_cross', 0.0), True))
  crossing = (seconds(classes.get('sync_cross', 0.0), True)
              + seconds(classes.get('async_cross', 0.0), True))
  link = sync + asynchronous
  if rates.overlap:
    f = rates.collective_overlap
    kernels = max(compute, hbm - exposed_hbm) + exposed_hbm
    step = max(kernels, f * asynchronous) + (1 - f) * asynchronous + sync
    exposed_link = step - kernels
  else:
    step = compute + hbm + link
    exposed_link = link
  update = grad_accum_steps * step
  ideal = model_flops_per_update / (chips * rates.peak_flops)
  return {'compute_s': compute, 'hbm_s': hbm, 'exposed_hbm_s': exposed_hbm,
          'link_s': link, 'network_s': crossing,
          'exposed_link_s': exposed_link,
          'link_share': link / step if step else 0.0,
          'step_s': step, 'predicted_step_s': update,
          'predicted_mfu': ideal / update}


def figures(compiled, shape: StepShape, grad_accum_steps: int,
            model_config, rates: Rates, chips: int,
            islands: list[int] | None = None
            ) -> tuple[StepCost, dict[str, float]]:
  """A compiled train step of ``shape`` (on ``chips`` chips, over
  ``islands``) through the model: its cost, and ``predict``'s figures for
  an update of ``grad_accum_steps`` steps."""
  cost = StepCost.of(compiled, kernel_flops(shape, model_config, chips),
                     islands)
  return cost, predict(cost, rates, grad_accum_steps,
                       update_flops(shape, grad_accum_steps, model_config),
                       chips)
