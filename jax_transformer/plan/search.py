"""The planner: the fastest layout of a run that fits a target, found by
the target's compiler.

Every candidate (``candidates.py``) is first sized by the pre-flight
estimate (``train/memory.py``): one over the chip's memory by more than
the estimate's error is pruned, and as compiles come in, one whose
estimate times the lowest ratio of the compiler's figure to the estimate
seen for its remat policy is over the chip's memory. The survivors are
ordered by a guess made without compiling (``guess``: FLOPs and
collective bytes counted from the model), and compiled in that order,
the config's own layout first, while the time budget lasts; each
compiled step's time comes from its executable (the step-time model of
``compile/step_model.py``, which the target report's roofline shares).
Compiled results are kept on disk by the fingerprint of the lowered
step, so a second plan compiles only what changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jax_transformer.compile import lowering, report, step_model
from jax_transformer.errors import UsageError, first_line
from jax_transformer.experiment import Experiment
from jax_transformer.model import sharding
from jax_transformer.plan import candidates as cands
from jax_transformer.runtime import targets, xla_options
from jax_transformer.train import memory, model_setup, perf, run_plan

# The estimate is within ~20% of the TPU compiler's figure
# (docs/scaling.md): a candidate is pruned only when even a 20%
# overestimate would not fit.
ESTIMATE_ERROR = 1.2
REMAT_RECOMPUTE = {'none': 1.0, 'dots': 1.05, 'full': 4 / 3}
# Part of each cache key: a change to what a compiled result holds (the
# cost counted from the HLO) makes older entries miss.
COST_VERSION = step_model.COST_VERSION
DEFAULT_CACHE = os.path.join(os.path.expanduser('~'), '.cache',
                             'jax_transformer', 'plan')


@dataclasses.dataclass(frozen=True)
class Where:
  """The chips a plan is for: a target's compile-only devices, or the
  devices at hand."""
  name: str
  devices: tuple
  platform: str              # 'tpu', 'gpu' or 'cpu'
  rates: step_model.Rates
  slices: int = 1

  @classmethod
  def target(cls, name: str, slices: int = 1,
             network_gbps: float | None = None) -> 'Where':
    """Target name's compile-only devices, its chip's rates (its
    network's at network_gbps a chip where given)."""
    t = targets.target(name)
    devices = tuple(report.target_devices(t, slices))
    return cls(name, devices, t.kernel_platform, step_model.Rates.of_target(
        t, targets.network_rate(t, network_gbps)), slices)

  @classmethod
  def here(cls, devices=None) -> 'Where':
    devices = tuple(devices or jax.devices())
    return cls('here', devices, targets.kernel_platform(devices[0].platform),
               step_model.Rates.of_devices(list(devices)))

  @property
  def chips(self) -> int:
    return len(self.devices)


def guess(c: cands.Candidate, cfg: Experiment, mc,
          num_params: int, where: Where) -> float:
  """Seconds per update by counting, without compiling: the model's FLOPs
  (with remat's recompute) at peak, plus the bytes FSDP gathers and
  scatters, data parallelism all-reduces, tensor parallelism moves
  between layers and the sequence axis gathers (keys and values), at
  link speed (both in full, as if nothing overlapped:
  a layout that moves more per FLOP, such as many accumulation steps each
  gathering every weight, comes later). Only orders the compiles."""
  rates, chips = where.rates, where.chips
  flops = perf.step_flops(mc, c.batch_size, cfg.source_len,
                          cfg.seq_len)['train']
  compute = flops * REMAT_RECOMPUTE[c.remat] / chips / rates.peak_flops
  # What moves is in the compute dtype where it is narrower: XLA casts
  # float32 parameters before it gathers them and reduces their gradients
  # as the matmuls wrote them.
  width = min(jnp.dtype(c.param_dtype).itemsize, mc.compute_dtype.itemsize)
  p = num_params * width / c.tensor
  moved = 0.0
  if c.fsdp > 1:    # gathered forward and backward, gradients scattered
    moved += 3 * p * (c.fsdp - 1) / c.fsdp
  if c.data > 1:    # gradients all-reduced
    moved += 2 * p / c.fsdp * (c.data - 1) / c.data
  if c.tensor > 1:  # two all-reduces of the activations a layer each way
    rows = c.batch_size // (c.data * c.fsdp)
    layers = mc.num_decoder_layers + mc.num_encoder_layers
    trips = 6 if c.remat == 'full' else 4
    moved += (trips * layers * 2 * rows * cfg.seq_len * mc.d_model * 2
              * (c.tensor - 1) / c.tensor)
  if c.sequence > 1:  # each layer's keys and values gathered, and their
    # gradients scattered back (gathered again where remat recomputes)
    rows = c.batch_size // (c.data * c.fsdp)
    layers = mc.num_decoder_layers + mc.num_encoder_layers
    trips = 3 if c.remat == 'full' else 2
    kv_width = mc.kv_heads * mc.head_dim / c.tensor
    moved += (trips * layers * 2 * rows * cfg.seq_len * kv_width
              * mc.compute_dtype.itemsize * (c.sequence - 1) / c.sequence)
  return c.grad_accum_steps * (compute + moved / rates.link_bytes_per_s
                               + loss_chunk_hbm(c, cfg, mc)
                               / rates.hbm_bytes_per_s)


def loss_chunk_hbm(c: cands.Candidate, cfg: Experiment,
                   mc) -> float:
  """HBM bytes per chip a step's chunked loss spends on its head: each
  chunk reads the gathered bf16 head three times (logits, their
  recomputation, the rows' gradient) and reads and writes its float32
  gradient slot, however few of the chunk's rows a chip holds."""
  if not c.loss_chunk_size:
    return 0.0
  chunks = -(-c.batch_size * cfg.seq_len // c.loss_chunk_size)
  head = mc.d_model * mc.vocab_size / c.tensor
  return chunks * head * (3 * 2 + 2 * 4)


class Cache:
  """Compiled candidates' results on disk, by the lowered step's
  fingerprint and the chips compiled for."""

  def __init__(self, directory: str | None):
    self.directory = directory
    if directory:
      os.makedirs(directory, exist_ok=True)

  def key(self, lowered, where: Where) -> str:
    text = lowered.as_text()
    salt = (f'{where.name}/{where.slices}/{where.platform}/'
            f'{jax.__version__}/{COST_VERSION}/'
            f'{xla_options.describe(where.platform)}')
    return hashlib.sha256((salt + '\n' + text).encode()).hexdigest()[:32]

  def get(self, key: str) -> dict | None:
    path = self._path(key)
    if not path or not os.path.exists(path):
      return None
    with open(path) as f:
      return json.load(f)

  def put(self, key: str, result: dict) -> None:
    path = self._path(key)
    if path:
      with open(path + '.tmp', 'w') as f:
        json.dump(result, f)
      os.replace(path + '.tmp', path)

  def _path(self, key: str) -> str | None:
    return os.path.join(self.directory, key + '.json') if self.directory \
        else None


@dataclasses.dataclass
class Sized:
  """A candidate with what is known of it before compiling."""
  candidate: cands.Candidate
  cfg: Experiment
  setup: model_setup.Setup
  estimate_bytes: int
  guess_s: float
  shipped: bool = False


class Sizer:
  """Candidates sized before compiling, each by its run's plan
  (``run_plan.build``). Only remat, dtype and accumulation change the
  model and optimizer: those setups are built once per variant and
  shared."""

  def __init__(self, base: Experiment, where: Where,
               vocab_size: int):
    self.base, self.where = base, where
    self.vocab_size = vocab_size
    self.setups, self.states = {}, {}

  def setup(self, cfg) -> model_setup.Setup:
    model_key = (cfg.model.remat, cfg.model.param_dtype)
    key = (*model_key, cfg.optim.grad_accum_steps)
    if key not in self.setups:
      base = self.setups.get(model_key)
      if base is None:
        base = self.setups[model_key] = model_setup.build(cfg,
                                                          self.vocab_size)
      self.setups[key] = model_setup.with_optimizer(base, cfg)
    return self.setups[key]

  def __call__(self, c: cands.Candidate) -> Sized:
    """c's config, setup, pre-flight estimate and guessed time."""
    cfg = c.apply(self.base)
    mesh = sharding.make_mesh(cfg.mesh.sizes, list(self.where.devices))
    sharding.check_batch(cfg.batch_size, mesh)
    setup = self.setup(cfg)
    params = sum(x.size for x in setup.abstract_params.values())
    if id(setup) not in self.states:  # one per setup, not per layout
      self.states[id(setup)] = model_setup.abstract_state_of(setup, cfg.seed)
    plan = run_plan.build(cfg, mesh, self.vocab_size, setup,
                          self.where.platform, self.states[id(setup)])
    return Sized(c, cfg, setup, plan.estimate.total,
                 guess(c, cfg, setup.model_config, params, self.where))


def compile_candidate(s: Sized, where: Where, cache: Cache,
                      vocab_size: int) -> dict[str, Any]:
  """s compiled (or found in the cache): its fits, per-chip memory,
  cost, compile time and fingerprint."""
  run = lowering.lower_train(s.cfg, list(where.devices), where.platform,
                             vocab_size, s.setup)
  key = cache.key(run.lowered, where)
  found = cache.get(key)
  if found is not None:
    return dict(found, status='cached', fingerprint=key)
  result = compiled_result(report.compile_lowered(run.lowered, run.lower_s),
                           s, where, step_model.islands(run.mesh.devices))
  cache.put(key, result)
  return dict(result, status='compiled', fingerprint=key)


def compiled_result(step: report.StepCompile, s: Sized, where: Where,
                    islands: list[int] | None = None) -> dict[str, Any]:
  """What the plan keeps of s's compiled step (its cost, from the
  executable: ``step_model.StepCost``; islands: ``step_model.islands`` of
  its mesh's devices)."""
  result = {'per_chip_bytes': step.per_chip_bytes,
            'compile_s': round(step.compile_s, 2)}
  if step.compiled is not None:
    cost = step_model.StepCost.of(
        step.compiled,
        step_model.kernel_flops(s.cfg.step_shape, s.setup.model_config,
                                where.chips),
        islands)
    result['cost'] = cost.to_json()
  return result


def plan(cfg: Experiment, spec: str, where: Where,
         global_batch: int, budget_s: float = 600,
         cache_dir: str | None = DEFAULT_CACHE, vocab_size: int = 32768,
         log: Callable[[str], None] | None = None,
         only: list[cands.Candidate] | None = None,
         param_dtypes: tuple[str, ...] = cands.PARAM_DTYPES,
         remats: tuple[str, ...] = cands.REMATS) -> list[dict]:
  """One row per candidate, best first: those that fit by the compiler,
  by predicted time per update; then the rest. ``only`` plans those
  candidates instead of every one; param_dtypes and remats limit the
  dtypes and remat policies enumerated (bfloat16 parameters change the
  training's numerics)."""
  log = log or (lambda line: print(line, file=sys.stderr, flush=True))
  start = time.perf_counter()
  own = cands.shipped(cfg, where.chips, global_batch)
  pool = only or cands.enumerate_candidates(cfg, where.chips, global_batch,
                                            where.slices, param_dtypes,
                                            remats)
  if not pool:
    raise UsageError(
        f'{global_batch} rows an update cannot be split over {where.chips} '
        f'chips by any layout (data x fsdp must divide the rows, tensor at '
        f'most {cands.MAX_TENSOR}, sequence splitting rows into parts of '
        f'{cands.MIN_SHARD_POSITIONS} positions or more); use a multiple of '
        f'{where.chips}.')
  pool = [own] + [c for c in pool if c != own]
  sizer = Sizer(cfg, where, vocab_size)
  capacity = where.rates.memory_bytes
  rows, survivors = [], []
  for c in pool:
    try:
      s = sizer(c)
    except (ValueError, UsageError) as err:  # a layout the run cannot take
      rows.append(_row(c, spec, where, global_batch, c == own,
                       status='invalid', reason=str(err)))
      continue
    s.shipped = c == own
    if capacity and s.estimate_bytes > ESTIMATE_ERROR * capacity \
        and not s.shipped:
      rows.append(_sized_row(s, spec, where, global_batch, status='pruned',
                             fits=False))
    else:
      survivors.append(s)
  log(f'{len(pool)} candidates; {len(survivors)} left after the memory '
      f'estimate ({time.perf_counter() - start:.0f} s).')
  survivors.sort(key=lambda s: (not s.shipped, s.guess_s, s.estimate_bytes))
  cache, spent, seen = Cache(cache_dir), [], {}
  ratios = {}  # remat policy -> the compiler's bytes over the estimate's
  for s in survivors:
    elapsed = time.perf_counter() - start
    # The longest compile so far: a plan should end inside its budget.
    expected = max(spent, default=0.0)
    if not s.shipped and elapsed + expected > budget_s:
      rows.append(_sized_row(s, spec, where, global_batch,
                             status='skipped', reason='no time left'))
      continue
    seen_ratios = ratios.get(s.candidate.remat)
    if capacity and seen_ratios and not s.shipped and (
        s.estimate_bytes * min(seen_ratios) > capacity):
      # The estimate recalibrated by this plan's compiles of the policy:
      # even at the lowest ratio seen, it would not fit.
      rows.append(_sized_row(
          s, spec, where, global_batch, status='pruned', fits=False,
          reason=f'estimate x {min(seen_ratios):.2f} (the compiler over the '
                 f'estimate for remat {s.candidate.remat}) is over the chip'))
      continue
    began = time.perf_counter()
    try:
      result = compile_candidate(s, where, cache, vocab_size)
    except Exception as err:  # pylint: disable=broad-except
      # One layout the compiler rejects is a row, not the end of the plan.
      reason = first_line(err) or type(err).__name__
      rows.append(_sized_row(s, spec, where, global_batch, status='error',
                             reason=reason[:300]))
      log(f'  {s.candidate.describe()}: did not compile: {reason[:200]}')
      continue
    if result['status'] == 'compiled':
      spent.append(time.perf_counter() - began)
    if result['fingerprint'] in seen and not s.shipped:
      result['status'] = 'duplicate'
      result['same_as'] = seen[result['fingerprint']]
    seen.setdefault(result['fingerprint'], s.candidate.describe())
    if result['per_chip_bytes'] and s.estimate_bytes:
      ratios.setdefault(s.candidate.remat, []).append(
          result['per_chip_bytes'] / s.estimate_bytes)
    row = compiled_row(s, result, spec, where, global_batch)
    rows.append(row)
    log(_progress(row))
  skipped = sum(r['status'] == 'skipped' for r in rows)
  if skipped:
    log(f'{skipped} candidates not compiled: the budget of {budget_s:.0f} s '
        'ran out (--budget_s).')
  log(f'Planned in {time.perf_counter() - start:.0f} s.')
  return rank(rows)


def rank(rows: list[dict]) -> list[dict]:
  """Rows best first: fitting compiled ones by predicted time per update,
  then the rest (by guessed time); each fitting row numbered.

  Predictions within 0.5% of each other are a tie (the step model cannot
  tell them apart). A tie goes to float32 parameters (bfloat16 ones change
  the training: weights and Adam's moments updated in bfloat16), then to
  the layout that moves the fewest bytes (``bytes_moved``: HBM and links,
  which the model hides partly behind compute but which cost a real run
  more the more there are), then to the least memory. Each fitting row
  says how it was placed (``ranked_by``)."""
  def seconds(r):
    return r['predicted_step_s'] or r.get('guess_step_s') or 0.0

  def fitting(r):
    return bool(r['fits']) and r['predicted_step_s'] is not None
  rows = sorted(rows, key=lambda r: (r['status'] == 'invalid',
                                     not fitting(r), seconds(r)))
  # Each tie group starts at a row more than 0.5% slower than the last
  # group's first row.
  group, first = 0, None
  for r in rows:
    if first is None or fitting(r) != fitting(first) or (
        seconds(r) > seconds(first) * 1.005):
      group, first = group + 1, r
    r['_tie'] = group
  rows.sort(key=lambda r: (r['_tie'], r['param_dtype'] != 'float32',
                           bytes_moved(r), r['per_chip_bytes'] or 0))
  sizes = {}
  for r in rows:
    sizes[r['_tie']] = sizes.get(r['_tie'], 0) + fitting(r)
  for r in rows:
    if fitting(r):
      r['ranked_by'] = ('predicted time' if sizes[r['_tie']] < 2 else
                        'a tie on predicted time (within 0.5%), broken by '
                        'float32 parameters first, then the fewest bytes '
                        'moved')
    del r['_tie']
  for i, r in enumerate(rows):
    r['rank'] = i + 1 if r.get('fits') and r.get('predicted_step_s') else None
  return rows


def bytes_moved(row: dict) -> float:
  """HBM and link bytes per chip an update moves (0 for a row not
  compiled)."""
  cost = row.get('cost_bytes') or {}
  return float(cost.get('hbm', 0.0) + cost.get('link', 0.0))


def _row(c: cands.Candidate, spec: str, where: Where, global_batch: int,
         shipped: bool, **extra) -> dict[str, Any]:
  return {'config': spec, 'target': where.name, 'slices': where.slices,
          'devices': where.chips, 'global_batch': global_batch,
          **dataclasses.asdict(c), 'layout': c.describe(),
          'shipped': shipped, 'fits': None, 'per_chip_bytes': None,
          'chip_memory_bytes': where.rates.memory_bytes,
          'predicted_step_s': None, 'predicted_mfu': None, 'compile_s': None,
          **extra}


def _sized_row(s: Sized, spec, where, global_batch, **extra) -> dict:
  return _row(s.candidate, spec, where, global_batch, s.shipped,
              estimate_bytes=s.estimate_bytes, guess_step_s=s.guess_s,
              **extra)


def compiled_row(s: Sized, result: dict, spec, where, global_batch
                 ) -> dict:
  """s's plan row from its compiled result (``compiled_result``): the
  step model's figures (``step_model.predict``) for an update."""
  row = _sized_row(s, spec, where, global_batch, **{
      k: v for k, v in result.items() if k != 'cost'})
  need, capacity = result['per_chip_bytes'], where.rates.memory_bytes
  row['fits'] = need is not None and (capacity is None or need <= capacity)
  if 'cost' in result:
    cost = step_model.StepCost(**result['cost'])
    mc = s.setup.model_config
    accum = s.cfg.optim.grad_accum_steps
    row.update(step_model.predict(
        cost, where.rates, accum,
        step_model.update_flops(s.cfg.step_shape, accum, mc), where.chips))
    row['collective_bytes'] = cost.collective_bytes
    row['attention_kernels'] = cost.attention_kernels
    row['cost_bytes'] = {'hbm': cost.hbm_bytes * accum,
                         'link': cost.link_bytes * accum}
  return row


def milliseconds(seconds: float) -> str:
  """'1050 ms', '12.4 ms', '0.118 ms'."""
  ms = seconds * 1e3
  return f'{ms:.0f} ms' if ms >= 100 else f'{ms:.3g} ms'


def _progress(row: dict) -> str:
  need = memory.readable(row['per_chip_bytes'] or 0)
  verdict = 'fits' if row['fits'] else 'does not fit'
  time_s = (f', {milliseconds(row["predicted_step_s"])} an update, predicted MFU '
            f'{row["predicted_mfu"]:.0%}' if row.get('predicted_step_s') else '')
  how = ('found in the cache' if row['status'] == 'cached' else
         row['status'])
  return (f'  {row["layout"]}: {verdict} ({need} a chip){time_s}; {how} '
          f'(compiled in {row["compile_s"] or 0:.0f} s)')
