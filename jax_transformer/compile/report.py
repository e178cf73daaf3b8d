"""A run's steps compiled by an accelerator's own compiler from a CPU
host, and what that compiler says: memory per chip against the chip's,
compile time, cost, collective bytes, the attention kernel, and the
step model's prediction of step time and MFU.

The prediction is the planner's step-time model (``step_model.py``) of
the compiled train step: compute, HBM and link seconds per chip, what of
them no overlap hides, the step's predicted time on an accelerator, and
the model's FLOPs at peak over that (``predicted_mfu``: a prediction, not
a bound). XLA's ``cost_analysis()`` counts a loop body once; the model
scales its FLOPs and bytes to the step by the HLO's own counts per loop
trip (``hlo_stats``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental import serialize_executable
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer import errors
from jax_transformer.compile import hlo_stats, lowering, step_model, topology
from jax_transformer.decoding import inputs, loop, sampling
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment, StepShape
from jax_transformer.model import attention, sharding
from jax_transformer.runtime import targets, xla_options
from jax_transformer.train import memory, perf

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
  # The compiler's own words when it refused the step for memory (its
  # RESOURCE_EXHAUSTED), whether or not they held a figure.
  refused: str | None = None

  def fits(self, capacity: int | None) -> bool:
    """Whether the step fits a chip of capacity bytes (None: unknown)."""
    if self.refused is not None:
      return False
    return (self.per_chip_bytes is not None
            and (capacity is None or self.per_chip_bytes <= capacity))


def compile_lowered(lowered: jax.stages.Lowered,
                    lower_s: float = 0.0) -> StepCompile:
  """lowered compiled; a step over the chip's memory (the compiler's
  RESOURCE_EXHAUSTED) is a StepCompile holding the need the compiler
  reported, where it reported one, and no executable."""
  start = time.perf_counter()
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as err:
    if 'RESOURCE_EXHAUSTED' not in str(err):
      raise
    over = _OVER_HBM.search(str(err))
    used = (int(float(over.group(1)) * _UNITS[over.group(2)]) if over
            else None)
    return StepCompile(lower_s + time.perf_counter() - start, used,
                       refused=errors.first_line(err))
  seconds = lower_s + time.perf_counter() - start
  stats = memory.Compiled.of(compiled)
  return StepCompile(seconds, stats.total if stats else None, compiled)


def _compile(jitted, args, mesh, platform: str) -> StepCompile:
  start = time.perf_counter()
  lowered = lowering.lower(jitted, args, mesh, platform)
  return compile_lowered(lowered, time.perf_counter() - start)


def compile_steps(cfg: Experiment, devices: list,
                  platform: str, vocab_size: int = 32768,
                  train_only: bool = False
                  ) -> tuple[StepCompile, StepCompile | None, dict]:
  """cfg's train and eval steps (and decode) on a mesh of devices; also
  facts of the run for the report (setup, the pre-flight estimate, the
  mesh). ``train_only``: the train step alone (evaluation and the decode
  None)."""
  run = lowering.lower_train(cfg, devices, platform, vocab_size)
  train = compile_lowered(run.lowered, run.lower_s)
  setup, mesh, shardings = run.setup, run.mesh, run.shardings
  facts = {'setup': setup, 'mesh': mesh, 'decode': None,
           'estimate': run.estimate}
  if train_only:
    return train, None, facts
  evaluation = _compile(run.plan.eval_step(), (run.state['params'], run.batch), mesh,
                        platform)
  facts['decode'] = compile_decode(cfg, setup, mesh, shardings['params'],
                                   platform)
  return train, evaluation, facts


def compile_decode(cfg: Experiment, setup, mesh,
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
    source = cfg.source_len
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
    lowered = loop.generate_jit.lower(
        graphdef, state, given, key, token, token,
        max_new_tokens=new_tokens, sampler=sampling.greedy, mesh=mesh)
  # Over the chip's memory, the compiler's refusal is a figure, as the
  # train and eval steps' are (compile_lowered).
  return compile_lowered(lowered, time.perf_counter() - start)


def roofline(train: StepCompile, shape: StepShape, grad_accum_steps: int,
             setup, rates: step_model.Rates, chips: int,
             islands: list[int] | None = None) -> dict[str, Any]:
  """The step model's prediction of the time of a step of ``shape`` from
  compute, HBM and links at rates (the network's between islands:
  ``step_model.islands``), and the MFU it predicts for an update of
  ``grad_accum_steps`` steps (``step_model.figures``: the planner's
  figures for the same executable)."""
  mc = setup.model_config
  model_flops = perf.step_flops(mc, shape.batch_size, shape.source_len,
                                shape.seq_len)['train']
  row = {'model_flops_per_step': model_flops,
         'compute_bound_s': model_flops / chips / rates.peak_flops}
  if train.compiled is None:
    return row
  cost, predicted = step_model.figures(train.compiled, shape,
                                       grad_accum_steps, mc, rates, chips,
                                       islands)
  xla = step_model.xla_cost(train.compiled)
  row.update(xla_flops_per_chip=xla.get('flops'),
             xla_bytes_accessed_per_chip=xla.get('bytes accessed'),
             flops_per_chip=cost.flops, hbm_bytes_per_chip=cost.hbm_bytes,
             collective_bytes=cost.collective_bytes,
             compute_bound_s=predicted['compute_s'],
             hbm_bound_s=predicted['hbm_s'],
             link_bound_s=predicted['link_s'],
             step_time_bound_s=predicted['step_s'],
             predicted_step_s=predicted['predicted_step_s'],
             predicted_mfu=predicted['predicted_mfu'],
             exposed_hbm_s=predicted['exposed_hbm_s'],
             network_s=predicted['network_s'],
             exposed_link_s=predicted['exposed_link_s'],
             link_share=predicted['link_share'],
             link_classes=cost.link_classes,
             network_bytes_per_s=rates.network_bytes_per_s,
             cost_version=step_model.COST_VERSION)
  return row


def report(cfg: Experiment, spec: str, target_name: str,
           slices: int = 1, serialize: str | None = None,
           train_only: bool = False,
           network_bytes_per_s: float | None = None) -> dict[str, Any]:
  """One JSON row: cfg (named spec) compiled for target_name x slices
  (``train_only``: the train step alone, the row without eval_* and
  decode_* fields; ``network_bytes_per_s``: the network's rate a chip
  between hosts or slices, the chip's default where None)."""
  target = targets.target(target_name)
  devices = target_devices(target, slices)
  platform = target.kernel_platform
  chip = targets.CHIPS[target.chip]
  kernel_note = None
  try:
    train, evaluation, facts = compile_steps(cfg, devices, platform,
                                             train_only=train_only)
  except jax.errors.JaxRuntimeError as err:
    if 'cudnn' not in str(err).lower():
      raise
    # cuDNN's fused attention compiles only with cuDNN's library at hand.
    cfg = cfg.replace(
        **{'model.attention_implementation': 'xla'})
    kernel_note = ("cudnn (auto) did not compile here: cuDNN's library is "
                   "not installed (pip install -e '.[aot-gpu]'); compiled "
                   'with xla')
    train, evaluation, facts = compile_steps(cfg, devices, platform,
                                             train_only=train_only)
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
      'mesh': dict(mesh.shape), 'mesh_spans': sharding.spans(mesh),
      'batch_size': cfg.batch_size,
      'seq_len': cfg.seq_len,
      'fits': train.fits(chip_memory),
      'per_chip_bytes': per_chip, 'chip_memory_bytes': chip_memory,
      'over_by_bytes': max(0, (per_chip or 0) - chip_memory),
      'estimate_bytes': facts['estimate'].total,
      'compile_s': round(train.compile_s, 2),
      **_other_steps(evaluation, facts['decode'], chip_memory),
      'refused': {name: step.refused for name, step in (
          ('train', train), ('eval', evaluation), ('decode', facts['decode']))
                  if step is not None and step.refused},
      'attention_kernel': kernel_note or kernel,
      'attention_kernels_in_hlo': in_hlo,
      'xla_options': xla_options.describe(target.kernel_platform),
      'async_collectives': (
          hlo_stats.async_collectives(train.compiled.as_text())
          if train.compiled is not None else None),
      # Which mesh axes the step's collectives run over ('sequence': the
      # keys and values gathered for attention, their gradients summed).
      'collective_bytes_by_axes': (
          hlo_stats.collective_bytes_by_axes(train.compiled.as_text(),
                                             dict(mesh.shape))
          if train.compiled is not None else None),
  }
  row.update(roofline(train, cfg.step_shape, cfg.optim.grad_accum_steps, setup,
                      step_model.Rates.of_target(target, network_bytes_per_s),
                      len(devices), step_model.islands(mesh.devices)))
  row.setdefault('predicted_mfu', None)
  if serialize and train.compiled is not None:
    _serialize(train.compiled, serialize)
    row['serialized'] = serialize
  return row


def _other_steps(evaluation: StepCompile | None,
                 decode: StepCompile | None,
                 chip_memory: int) -> dict[str, Any]:
  """The row's eval_* and decode_* fields (none for a train step alone)."""
  fields = {}
  for name, step in (('eval', evaluation), ('decode', decode)):
    if step is not None:
      fields.update({f'{name}_compile_s': round(step.compile_s, 2),
                     f'{name}_per_chip_bytes': step.per_chip_bytes,
                     f'{name}_fits': step.fits(chip_memory)})
  return fields


def target_devices(target: targets.Target, slices: int = 1) -> list:
  """The target's compile-only devices, its compiler started with the
  collective-overlap options (``xla_options.apply``: unless turned off;
  a compiler already started in this process keeps the options it
  started with)."""
  xla_options.apply([target.kernel_platform])
  return topology.devices(target, slices)


def _serialize(compiled, path: str) -> None:
  """Writes the compiled train step (``jax.experimental.serialize_executable``)."""
  payload, _, _ = serialize_executable.serialize(compiled)
  with open(path, 'wb') as f:
    f.write(payload)


# The row's fields of each step, in the order a refusal names them.
_STEPS = (('train', 'fits', 'per_chip_bytes', 'to train'),
          ('eval', 'eval_fits', 'eval_per_chip_bytes', 'to evaluate'),
          ('decode', 'decode_fits', 'decode_per_chip_bytes', 'to decode'))


def check_fits(cfg: Experiment, spec: str,
               target_name: str, slices: int = 1) -> dict[str, Any]:
  """report(), then UsageError in one sentence when the run's train step,
  eval step or decode does not fit a chip, by the compiler's figures or
  by its own RESOURCE_EXHAUSTED."""
  row = report(cfg, spec, target_name, slices)
  refusal = not_fitting(row, f'--aot_target {target_name}')
  if refusal:
    raise UsageError(refusal)
  return row


def not_fitting(row: dict[str, Any], where: str) -> str | None:
  """The one-sentence refusal of a report row, None when every step fits."""
  have = memory.readable(row['chip_memory_bytes'])
  for name, fits, need, doing in _STEPS:
    if row.get(fits, True):
      continue
    need = row.get(need)
    by = f'by the {row["device_kind"]} compiler'
    said = row.get('refused', {}).get(name)
    if need is None and said:
      return (f'{where}: {row["config"]} does not fit {doing} {by}, which '
              f'ran out of memory ({said.rstrip(".")}), and a chip has '
              f'{have}; {memory.ADVICE}.')
    return (f'{where}: {row["config"]} needs {memory.readable(need or 0)} '
            f'per chip {doing} {by}, and a chip has {have}; '
            f'{memory.ADVICE}.')
  return None


def summary(row: dict[str, Any]) -> str:
  """The row in one line for a person."""
  need = memory.readable(row['per_chip_bytes'] or 0)
  have = memory.readable(row['chip_memory_bytes'])
  verdict = ('fits' if row['fits'] else
             f'does not fit (over by {memory.readable(row["over_by_bytes"])})')
  for name, fits, _, _ in _STEPS[1:]:
    if row['fits'] and not row.get(fits, True):
      verdict = f'fits, but its {name} does not'

  mfu = (f'{row["predicted_mfu"]:.0%} (links {row["link_share"]:.0%} of '
         f'the step), by the step model v{row["cost_version"]}'
         if row.get('predicted_mfu') is not None else 'unknown')
  by_axes = row.get('collective_bytes_by_axes') or {}
  over_rows = sum(v for k, v in by_axes.items() if 'sequence' in k.split('+'))
  rows = (f'; collectives over the sequence axis '
          f'{memory.readable(over_rows)} a step'
          if row['mesh'].get('sequence', 1) > 1 and by_axes else '')
  return (f'{row["config"]} on {row["target"]} ({row["devices"]} x '
          f'{row["device_kind"]}, mesh {row["mesh"]}): {verdict}: {need} '
          f'per chip of {have}; compiled in {row["compile_s"]:.1f} s; '
          f'predicted MFU {mfu}; attention {row["attention_kernel"]}{rows}.')
