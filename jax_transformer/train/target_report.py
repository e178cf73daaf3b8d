"""A run's steps compiled by an accelerator's own compiler from a CPU
host, and what that compiler says: memory per chip against the chip's,
compile time, cost, collective bytes, the attention kernel, and a
roofline bound on step time and MFU.

The roofline: a step takes at least the longest of its model FLOPs at the
chips' peak (compute), its bytes accessed at HBM bandwidth (memory) and
its collective bytes over the chip's links (communication); the MFU bound
is compute / that. XLA's ``cost_analysis()`` counts a loop body once, so
its bytes are scaled by the ratio of the model's FLOPs per chip to its
FLOPs (a scanned stack of layers); collective bytes are counted per loop
trip from the HLO (``hlo_stats``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.experimental import serialize_executable
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.decoding import inputs, loop, sampling
from jax_transformer.errors import UsageError
from jax_transformer.model import attention, sharding
from jax_transformer.runtime import targets
from jax_transformer.train import (
  aot,
  checks,
  experiment,
  hlo_stats,
  memory,
  perf,
  steps,
)

# A TPU step over HBM fails to compile with, e.g., "the total memory
# required for HLO temporaries (20.81G) exceeds available HBM (15.75G)" or
# "Used 20.51G of 15.75G hbm": the first figure is the need.
_OVER_HBM = re.compile(r'(?:required for [^(]*\(|Used )([\d.]+)([KMGT])')
_UNITS = {'K': 2 ** 10, 'M': 2 ** 20, 'G': 2 ** 30, 'T': 2 ** 40}


@dataclasses.dataclass
class StepCompile:
  """One step compiled (or refused for memory) by the target's compiler."""
  compile_s: float
  per_chip_bytes: int | None
  compiled: Any = None       # jax.stages.Compiled, None when over memory


def lower(jitted, args, mesh, platform: str) -> jax.stages.Lowered:
  """jitted lowered for args as the platform's compiler would get it (its
  attention kernel, the mesh's activation constraints)."""
  with attention.compiling_for(platform), \
      jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return jitted.lower(*args)


def compile_lowered(lowered: jax.stages.Lowered,
                    lower_s: float = 0.0) -> StepCompile:
  """lowered compiled; a step over the chip's memory is a StepCompile
  holding the need the compiler reported, and no executable."""
  start = time.perf_counter()
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as err:
    over = _OVER_HBM.search(str(err))
    if 'RESOURCE_EXHAUSTED' not in str(err) or not over:
      raise
    used = float(over.group(1)) * _UNITS[over.group(2)]
    return StepCompile(lower_s + time.perf_counter() - start, int(used))
  seconds = lower_s + time.perf_counter() - start
  stats = memory.Compiled.of(compiled)
  return StepCompile(seconds, stats.total if stats else None, compiled)


def _compile(jitted, args, mesh, platform: str) -> StepCompile:
  start = time.perf_counter()
  lowered = lower(jitted, args, mesh, platform)
  return compile_lowered(lowered, time.perf_counter() - start)


@dataclasses.dataclass
class TrainLowering:
  """A run's train step lowered for a mesh of devices, with what the
  report needs of the run."""
  lowered: jax.stages.Lowered
  lower_s: float
  setup: experiment.Setup
  mesh: jax.sharding.Mesh
  shardings: dict[str, Any]
  state: dict[str, Any]          # ShapeDtypeStructs with shardings
  batch: dict[str, Any]
  estimate: memory.Footprint


def lower_train(cfg: ml_collections.ConfigDict, devices: list,
                platform: str, vocab_size: int = 32768,
                setup: experiment.Setup | None = None) -> TrainLowering:
  """cfg's train step lowered on a mesh of devices, and the pre-flight
  estimate (``setup`` reuses one built for cfg's model and optimizer)."""
  checks.check_run_fields(cfg)
  mesh = sharding.make_mesh(cfg.mesh, devices)
  sharding.check_batch(cfg.batch_size, mesh)
  setup = setup or experiment.setup(cfg, vocab_size)
  abstract_state = setup.abstract_state(cfg.seed)
  shardings, _ = steps.state_shardings(setup, mesh, abstract_state)
  state = steps.sharded_abstract(abstract_state, shardings)
  batch = aot.abstract_batch(cfg, mesh)
  with attention.compiling_for(platform):  # 'auto' as the target picks
    estimate = memory.estimate(cfg, setup.model_config, abstract_state,
                               shardings, mesh)
  start = time.perf_counter()
  lowered = lower(steps.jit_train_step(cfg, setup, mesh, shardings),
                  (state, batch), mesh, platform)
  return TrainLowering(lowered, time.perf_counter() - start, setup, mesh,
                       shardings, state, batch, estimate)


def compile_steps(cfg: ml_collections.ConfigDict, devices: list,
                  platform: str, vocab_size: int = 32768
                  ) -> tuple[StepCompile, StepCompile, dict]:
  """cfg's train and eval steps on a mesh of devices; also facts of the
  run for the report (setup, the pre-flight estimate, the mesh)."""
  run = lower_train(cfg, devices, platform, vocab_size)
  train = compile_lowered(run.lowered, run.lower_s)
  setup, mesh, shardings = run.setup, run.mesh, run.shardings
  eval_step = jax.jit(
      steps.make_eval_step(setup.model_def, packed=False,
                           loss_chunk_size=cfg.get('loss_chunk_size') or 0),
      in_shardings=(shardings['params'], sharding.batch_sharding(mesh)),
      out_shardings=NamedSharding(mesh, PartitionSpec()))
  evaluation = _compile(eval_step, (run.state['params'], run.batch), mesh,
                        platform)
  decode = compile_decode(cfg, setup, mesh, shardings['params'], platform)
  facts = {'setup': setup, 'mesh': mesh, 'decode': decode,
           'estimate': run.estimate}
  return train, evaluation, facts


def compile_decode(cfg: ml_collections.ConfigDict, setup, mesh,
                   param_shardings, platform: str) -> StepCompile:
  """The whole KV-cached greedy decode (``decoding.loop.generate_jit``) of
  eval_batch_size rows: an LM continues seq_len / 2 prompt tokens to
  seq_len; a translation model decodes seq_len tokens from src_len."""
  params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                    sharding=param_shardings[k])
            for k, v in setup.abstract_params.items()}
  graphdef, state = nnx.split(setup.model_def.merge(params))
  rows = cfg.eval_batch_size
  mesh = inputs.resolve_mesh(mesh, rows)
  by_row = NamedSharding(mesh, PartitionSpec('data'))
  whole = NamedSharding(mesh, PartitionSpec())

  def ids(length, dtype=jnp.int32):
    return jax.ShapeDtypeStruct((rows, length), dtype, sharding=by_row)
  if setup.model_config.num_encoder_layers:
    source = cfg.data.get('src_len') or cfg.seq_len
    given = inputs.Inputs(ids(1), ids(1, jnp.bool_), ids(source),
                          ids(source, jnp.bool_))
    new_tokens = cfg.seq_len - 1
  else:
    prompt = cfg.seq_len // 2
    given = inputs.Inputs(ids(prompt), ids(prompt, jnp.bool_), None, None)
    new_tokens = cfg.seq_len - prompt
  key = jax.ShapeDtypeStruct((), jax.eval_shape(jax.random.key, 0).dtype,
                             sharding=whole)
  token = jax.ShapeDtypeStruct((), jnp.int32, sharding=whole)
  start = time.perf_counter()
  with attention.compiling_for(platform), jax.set_mesh(mesh):
    compiled = loop.generate_jit.lower(
        graphdef, state, given, key, token, token,
        max_new_tokens=new_tokens, sampler=sampling.greedy,
        mesh=mesh).compile()
  stats = memory.Compiled.of(compiled)
  return StepCompile(time.perf_counter() - start,
                     stats.total if stats else None, compiled)


def xla_cost(compiled) -> dict[str, float]:
  """XLA's cost analysis of a compiled step (empty where it has none)."""
  try:
    cost = compiled.cost_analysis()
  except (NotImplementedError, jax.errors.JaxRuntimeError):
    return {}
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return dict(cost or {})


def roofline(train: StepCompile, cfg: ml_collections.ConfigDict, setup,
             chip: targets.Chip, chips: int) -> dict[str, Any]:
  """Bounds on the step's time from compute, HBM and links; the MFU bound.
  """
  src_len = (cfg.data.get('src_len') or cfg.seq_len
             if setup.model_config.num_encoder_layers else 0)
  model_flops = perf.step_flops(setup.model_config, cfg.batch_size, src_len,
                                cfg.seq_len)['train']
  compute_s = model_flops / (chips * perf.peak_flops(chip.kind))
  row = {'model_flops_per_step': model_flops, 'compute_bound_s': compute_s}
  if train.compiled is None:
    return row
  cost = xla_cost(train.compiled)
  flops, accessed = cost.get('flops'), cost.get('bytes accessed')
  hlo = train.compiled.as_text()
  moved = hlo_stats.collective_bytes(hlo)
  row.update(xla_flops_per_chip=flops, xla_bytes_accessed_per_chip=accessed,
             collective_bytes=moved,
             link_bound_s=hlo_stats.link_bytes(moved) / chip.link_bytes_per_s)
  bounds = [compute_s, row['link_bound_s']]
  if flops and accessed:
    loops = max(1.0, model_flops / chips / flops)
    row['hbm_bound_s'] = accessed * loops / chip.hbm_bytes_per_s
    bounds.append(row['hbm_bound_s'])
  row['step_time_bound_s'] = max(bounds)
  row['mfu_bound'] = compute_s / row['step_time_bound_s']
  return row


def report(cfg: ml_collections.ConfigDict, spec: str, target_name: str,
           slices: int = 1, serialize: str | None = None) -> dict[str, Any]:
  """One JSON row: cfg (named spec) compiled for target_name x slices."""
  target = targets.target(target_name)
  devices = targets.devices(target, slices)
  platform = 'gpu' if target.platform == 'cuda' else 'tpu'
  chip = targets.CHIPS[target.chip]
  kernel_note = None
  try:
    train, evaluation, facts = compile_steps(cfg, devices, platform)
  except jax.errors.JaxRuntimeError as err:
    if 'cudnn' not in str(err).lower():
      raise
    # cuDNN's fused attention compiles only with cuDNN's library at hand.
    cfg = cfg.copy_and_resolve_references()
    cfg.model.attention_implementation = 'xla'
    kernel_note = ("cudnn (auto) did not compile here: cuDNN's library is "
                   "not installed (pip install -e '.[aot-gpu]'); compiled "
                   'with xla')
    train, evaluation, facts = compile_steps(cfg, devices, platform)
  setup, mesh = facts['setup'], facts['mesh']
  in_hlo = (hlo_stats.attention_kernels(train.compiled.as_text())
            if train.compiled is not None else [])
  # What the compiled step runs: a fused kernel where the HLO calls one
  # (splash falls back to XLA for masks and lengths it does not take).
  kernel = {'pallas': 'splash', 'cudnn': 'cudnn'}.get(
      in_hlo[0] if in_hlo else None, 'xla')
  per_chip = train.per_chip_bytes
  chip_memory = memory.builtin_memory(chip.kind)
  row = {
      'config': spec, 'target': target.name, 'slices': slices,
      'devices': len(devices), 'device_kind': devices[0].device_kind,
      'mesh': dict(mesh.shape), 'batch_size': cfg.batch_size,
      'seq_len': cfg.seq_len,
      'fits': per_chip is not None and per_chip <= chip_memory,
      'per_chip_bytes': per_chip, 'chip_memory_bytes': chip_memory,
      'over_by_bytes': max(0, (per_chip or 0) - chip_memory),
      'estimate_bytes': facts['estimate'].total,
      'compile_s': round(train.compile_s, 2),
      'eval_compile_s': round(evaluation.compile_s, 2),
      'eval_per_chip_bytes': evaluation.per_chip_bytes,
      'decode_compile_s': round(facts['decode'].compile_s, 2),
      'decode_per_chip_bytes': facts['decode'].per_chip_bytes,
      'attention_kernel': kernel_note or kernel,
      'attention_kernels_in_hlo': in_hlo,
  }
  row.update(roofline(train, cfg, setup, chip, len(devices)))
  row.setdefault('mfu_bound', None)
  if serialize and train.compiled is not None:
    _serialize(train.compiled, serialize)
    row['serialized'] = serialize
  return row


def _serialize(compiled, path: str) -> None:
  """Writes the compiled train step (``jax.experimental.serialize_executable``)."""
  payload, _, _ = serialize_executable.serialize(compiled)
  with open(path, 'wb') as f:
    f.write(payload)


def check_fits(cfg: ml_collections.ConfigDict, spec: str,
               target_name: str, slices: int = 1) -> dict[str, Any]:
  """report(), then UsageError in one sentence when the run does not fit."""
  row = report(cfg, spec, target_name, slices)
  if not row['fits']:
    need = memory.readable(row['per_chip_bytes'] or 0)
    have = memory.readable(row['chip_memory_bytes'])
    raise UsageError(
        f'--aot_target {target_name}: {spec} needs {need} per chip by the '
        f'{row["device_kind"]} compiler, and a chip has {have}; '
        f'{memory.ADVICE}.')
  return row


def summary(row: dict[str, Any]) -> str:
  """The row in one line for a person."""
  need = memory.readable(row['per_chip_bytes'] or 0)
  have = memory.readable(row['chip_memory_bytes'])
  verdict = ('fits' if row['fits'] else
             f'does not fit (over by {memory.readable(row["over_by_bytes"])})')
  mfu = (f'{row["mfu_bound"]:.0%}' if row.get('mfu_bound') is not None
         else 'unknown')
  return (f'{row["config"]} on {row["target"]} ({row["devices"]} x '
          f'{row["device_kind"]}, mesh {row["mesh"]}): {verdict}: {need} '
          f'per chip of {have}; compiled in {row["compile_s"]:.1f} s; MFU '
          f'bound {mfu}; attention {row["attention_kernel"]}.')
