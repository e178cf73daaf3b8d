"""The training loop: next batch, step, hooks.

``train_and_evaluate`` checks a run (``check_run``), opens its checkpoint
tiers (tiers.py), prepares its data and state (``prepare_run``; the
state's origin is origins.py's), then ``run_steps`` reads a batch, runs a
step and tells the run's hooks (hooks.py), which do everything else:
checkpoints, evaluation, metrics rows, progress, the goodput clock, the
stall watch, the finite check, the profiler, stop signals and fault
points. The math is in ``steps.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from typing import AbstractSet as Set
from typing import Any, Sequence

import jax
from absl import logging
from jax.sharding import Mesh

from jax_transformer import data
from jax_transformer.data import corpus
from jax_transformer.errors import UsageError, named_line
from jax_transformer.experiment import Experiment, doors
from jax_transformer.interop.hf_checkpoint import Source
from jax_transformer.model import sharding
from jax_transformer.runtime import distributed, faults, stall, storage
from jax_transformer.runtime.workdir import (
  CONFIG_FILE,
  FINGERPRINT_FILE,
  METRICS_FILE,
  TOKENIZER_DIR,
  WorkdirPaths,
  resolve,
)
from jax_transformer.train import (
  checkpoint,
  evaluating,
  finite,
  first_step,
  goodput,
  init_from,
  local_tier,
  memory,
  metrics,
  origins,
  perf,
  preemption,
  profiling,
  progress,
  run_plan,
  steps,
)
from jax_transformer.train.evaluating import evaluate  # noqa: F401 (tests wrap it)
from jax_transformer.train.hooks import Hooks, Run
from jax_transformer.train.tiers import Tiers

# Steps the host waits longer for than this run one at a time (see
# InFlight), so that a stop signal waits for one step, not two.
SLOW_STEP_S = 1.0


def log(*args) -> None:
  if jax.process_index() == 0:
    print(*args, flush=True)


def log_error(line: str) -> None:
  """One line for the user on stderr, from process 0 only."""
  if jax.process_index() == 0:
    print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Checked:
  """A run after every refusal that needs no data: the experiment (with
  config.init_from's model fields), its workdir, its mesh, and the
  pretrained model init_from names, opened (None: none)."""
  exp: Experiment
  workdir: WorkdirPaths
  mesh: Mesh
  source: Source | None


def train_and_evaluate(cfg: Experiment | Any,
                       workdir: str | WorkdirPaths,
                       hooks: Sequence[Any] = (),
                       explicit: Set[str] = frozenset()) -> dict[str, Any]:
  """Trains (resuming from workdir if it holds a checkpoint); returns the
  last logged metrics, with 'interrupted' (why: a signal's name, or what a
  hook set as run.stop) when the run stopped early after saving.

  cfg: an Experiment, or a ConfigDict or mapping of its fields (this is
  a door: it is converted here). hooks: your own (see hooks.py), acting
  after the metrics rows and the evaluation and before the finite check,
  stopping and saving at each moment. explicit: the config fields the
  command line gave (``model.d_model``, ...), which config.init_from's
  model may not contradict.
  """
  checked = check_run(doors.from_caller(cfg), resolve(workdir), explicit)
  # Ends this process with one line if another one is lost (liveness.py).
  watchdog = distributed.watch(os.fspath(checked.workdir.checkpoints))
  with opened(checked) as (tiers, writer, stop):
    run, compile_step = prepare_run(checked, tiers, writer, hooks, stop)
    run_steps(run, compile_step)
  if watchdog:  # not on an error: the others must see this process go
    watchdog.stop()
  return run.row if run.stop is None else {**run.row, 'interrupted': run.stop}


@contextlib.contextmanager
def opened(checked: Checked):
  """(the checkpoint tiers, the metrics writer, the stop signal) of a run.
  A stop signal stops it at once until its state is made
  (preemption.StoppedBeforeFirstStep), then after a step and a save. On
  every exit (finished, stopped, refused, failed) no save or thread of the
  run outlives it; a start that failed before keeping anything leaves the
  workdir as it found it (``remove_failed_start``)."""
  workdir = checked.workdir
  # What the workdir held before this start (None: no such folder).
  before = storage.names(workdir.root)
  check_workdir(workdir.root, 0, 'workdir writable')
  writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0)
  stop = preemption.Preemption()
  tiers, failed = None, True
  try:
    tiers = Tiers.open(checked.exp, workdir, checked.mesh)
    yield tiers, writer, stop
    failed = False
  finally:
    stop.restore()
    if tiers:
      tiers.close()
    writer.close()
    if failed:
      remove_failed_start(workdir, before)


def check_run(exp: Experiment, workdir: WorkdirPaths,
              explicit: Set[str] = frozenset()) -> Checked:
  """Everything that can be refused before any data is prepared (the same
  on every process: no agreement needed): the fields, config.init_from's
  model fields (``explicit``: those the command line gave), a workdir
  holding another run, the mesh, the local tier's directory."""
  exp = run_plan.checked(exp)
  exp, source = init_from.resolve_model(exp, workdir, explicit)
  # data.accept_changed_corpus left on only where the corpus changed.
  exp = check_resumable(exp, workdir)
  mesh = run_plan.mesh_for(exp)
  local_tier.check_paths(exp.local_checkpoint_dir, workdir)
  return Checked(exp, workdir, mesh, source)


def check_resumable(exp: Experiment, workdir: str | WorkdirPaths
                    ) -> Experiment:
  """Refuses to resume a workdir trained with another model or data
  (``Experiment.changed_since``, paths compared absolute: an old
  config.json's relative ones from the current directory), or on files
  that changed since it started unless config.data.accept_changed_corpus
  says to go on (then one line says the data iterator starts afresh).
  Returns exp with accept_changed_corpus True only where that applies,
  which ``data.train_iterator`` reads."""
  saved = checkpoint.load_config(workdir)
  changed = saved and exp.changed_since(saved)
  if changed:
    raise UsageError(f'{workdir} holds a run with a different config.'
                     f'{changed}; use a new --workdir or the same config to '
                     'resume.')
  old = corpus.read(resolve(workdir).root) if saved else None
  # Only a run that recorded its files compares them (recording names the
  # files, which an imported workdir's data config may not have).
  what = (corpus.change(old, corpus.record(exp.data))
          if old and 'files' in old else None)
  if what and not exp.data.accept_changed_corpus:
    raise UsageError(f'The corpus of {workdir} changed since this run '
                     f'started: {what}; pass '
                     '--config.data.accept_changed_corpus=true to go on with '
                     'the new corpus, which restarts the data iterator.')
  if what:
    log(f'The corpus changed since this run started: {what}; going on with '
        'it (config.data.accept_changed_corpus): the data iterator starts '
        'afresh.')
  return exp.replace(**{'data.accept_changed_corpus': bool(what)})


def prepare_run(checked: Checked, tiers: Tiers,
                writer: metrics.MetricWriter, extra_hooks: Sequence[Any],
                stop: preemption.Preemption):
  """The run up to its first step: data prepared and measured, the state's
  origin chosen (origins.py), tokenizer and side files in the workdir, the
  state restored or made (sharded), the hooks; returns (run,
  compile_step(run, batch) -> the compiled train step)."""
  exp, workdir = checked.exp, checked.workdir
  clock = goodput.Clock()  # start-up until the loop
  first = first_step.FirstStep()  # the line when the first step is done
  faults.reached('prepare', 0)
  prepared = prepare_data(exp)
  origin = origins.choose(exp, tiers, checked.source)
  tokenizer = checkpoint.run_tokenizer(
      workdir, origin.tokenizer(prepared.tokenizer), origin.resuming)
  plan = run_plan.build(exp, checked.mesh, tokenizer.vocab_size)
  budget = preflight(plan)
  # Before the side files: a refused run leaves no config.json that a
  # rerun with longer rows would have to match.
  check_data(exp, tokenizer)
  stop.check()
  write_side_files(plan, workdir, tokenizer)
  with first.timed('data iterator'):
    train_iter = data.train_iterator(exp.train_batches, tokenizer)
  state, line = origin.state(plan, train_iter, first.timed, log_error)
  if line:
    log(line)
  run = Run(exp.num_steps, workdir, checked.mesh, plan.setup, tokenizer,
            writer, clock, train_iter, state,
            step=int(jax.device_get(state['step'])))
  run.hooks = Hooks(make_hooks(run, exp, tiers, plan,
                               [first, *extra_hooks], stop), clock)
  stop.check()
  stop.at_once = None  # the state is made: a signal now saves, then stops
  train_step = plan.train_step()
  return run, lambda run, batch: _compile(
      run, train_step, batch,
      lambda compiled: memory.after_compile(compiled, budget, plan.estimate))


def preflight(plan: run_plan.RunPlan) -> memory.Budget:
  """Prints the sharding report and the memory pre-flight (which refuses
  a run that cannot fit); returns the device memory budget the compiled
  step is checked against."""
  setup = plan.setup
  log(sharding.report(setup.abstract_params, setup.model_def.logical_axes,
                      plan.param_specs, plan.mesh))
  budget = memory.Budget.of(plan.exp.device_memory_gb)
  log(memory.preflight(plan.estimate, budget))
  return budget


def write_side_files(plan: run_plan.RunPlan, workdir: WorkdirPaths,
                     tokenizer) -> None:
  """config.json, the tokenizer and the corpus record in the workdir
  (process 0), after every process checked it has room for a checkpoint."""
  check_workdir(workdir.root, _state_bytes(plan.abstract_state),
                'workdir has space')
  distributed.barrier('workdir read')  # nobody reads tokenizer/ while
  if jax.process_index() == 0:         # process 0 writes it
    checkpoint.save_side_files(workdir, plan.exp.saved_form(),
                               plan.exp.data, tokenizer)


def remove_failed_start(workdir: WorkdirPaths, before: list[str] | None
                        ) -> None:
  """After a run that stopped (refused, failed, signalled) before keeping
  anything, neither a checkpoint nor a metrics row, removes what it added
  to the workdir (the folder too where there was none), so that nothing
  half-written remains: no config.json that a rerun with other model
  fields would have to match. What the workdir held before stays. With
  several processes, process 0 removes only the files it alone writes
  (config.json, tokenizer/), the others possibly still in the folder."""
  try:
    now = storage.names(workdir.root)
    if now is None:
      return
    steps_kept = storage.names(workdir.checkpoints) or []
    if any(name.isdigit() for name in steps_kept):
      return
    added = [name for name in now if name not in (before or [])]
    if METRICS_FILE in added:  # rows: the run got as far as steps
      return
    if jax.process_count() > 1:
      if jax.process_index() != 0:
        return
      added = [name for name in added
               if name in (CONFIG_FILE, TOKENIZER_DIR, FINGERPRINT_FILE,
                             corpus.DATA_FILE)]
    storage.remove(workdir.root, added,
                   folder_too=before is None and jax.process_count() == 1)
  except Exception as err:  # pylint: disable=broad-except
    # Never in place of the failure being reported.
    logging.warning('Could not remove what the failed start wrote to %s: '
                    '%s', workdir, err)


def make_hooks(run: Run, cfg: Experiment, tiers: Tiers,
               plan: run_plan.RunPlan, extra: Sequence[Any] = (),
               stop: preemption.Preemption | None = None) -> list:
  """The run's hooks, in the order they act at each moment: the end of
  the first batch's wait first (a stop then waits for its step), rows
  (with the evaluation and time parts), the extra ones, the finite check,
  stopping (``stop``, made here unless given), then saving (so a stop any
  of them asks for is saved); the clock last, so that its rows and summary
  hold the others' time."""
  stop = stop or preemption.Preemption(at_once=None)
  eval_step = steps.traced_under(run.mesh, plan.eval_step())
  # Ends this process if nothing progresses for config.step_timeout_s.
  watch = stall.StallWatch(cfg.step_timeout_s,
                           os.fspath(run.workdir.checkpoints))
  return [
      preemption.FirstBatchRead(stop),
      faults.FaultPoints(),
      profiling.Profiler(cfg.profile, run.workdir, run.main),
      progress.ProgressBar(run.step, cfg.num_steps, run.main),
      metrics.Rows(run.setup, metrics.Throughput(
          cfg.step_shape, run.setup.model_config, cfg.peak_tflops),
          cfg.log_every, cfg.optim.grad_accum_steps),
      evaluating.Evaluation(cfg.evaluation, eval_step, stop, watch, evaluate),
      *extra,
      finite.FiniteCheck(tiers.persistent, cfg.optim.max_skipped_updates),
      stop,
      *tiers.saving_hooks(cfg.checkpoint_every),
      evaluating.Sample(cfg.evaluation, stop),
      watch,  # after the others: it watches their ends too
      goodput.TimeParts(run.clock),
  ]


def run_steps(run: Run, compile_step) -> None:
  """Trains from run.step to config.num_steps, or until a hook sets
  run.stop; each step: next batch, step, hooks. compile_step(run, batch)
  gives the compiled train step."""
  hooks, clock = run.hooks, run.clock
  in_flight = InFlight(run)
  run.finish_steps = in_flight.finish
  compiled = None
  try:
    hooks.start(run)
    while run.step < run.num_steps and run.stop is None:
      hooks.before_step(run)
      with clock.charged('data_wait'):
        batch = data.global_batch(next(run.train_iter), run.mesh)
      compiled = compiled or compile_step(run, batch)
      hooks.launching(run)
      run.state, metrics_ = compiled(run.state, batch)
      run.step += 1
      hooks.dispatched(run, metrics_)
      in_flight.add(run.step, metrics_)
      hooks.after_step(run)
  finally:
    run.train_iter.close()  # its worker processes end with the loop
    hooks.end(run)
  run.finished_now = run.finished_now or (run.last
                                          and run.step > run.start_step)
  hooks.completed(run)


def _compile(run: Run, train_step, batch, check_memory):
  """train_step compiled for the run's state and batch (its first step);
  check_memory(compiled) -> the line saying whether it fits (or raises)."""
  run.hooks.compiling(run)
  with run.clock.charged('compile'), \
      jax.sharding.use_abstract_mesh(run.mesh.abstract_mesh):
    compiled, run.compile_s = perf.compile_timed(train_step, run.state, batch)
  log(f'Compiled the train step in {run.compile_s:.1f} s.')
  # Before the first step, so a refusal never follows a new save.
  log(check_memory(compiled))
  # Hosts compile at different speeds, and the first step's collectives
  # give up on a late host after a fixed while (30 s for CPU gloo): start
  # it together.
  distributed.barrier('train step compiled')
  run.hooks.compiled(run)
  return compiled


class InFlight:
  """The steps dispatched but not yet seen finished: at most two, so the
  progress bar counts finished steps and a stop signal or a save never
  waits behind a backlog; a slow step (over SLOW_STEP_S) gains nothing
  from the next one queued behind it, and would make a stop wait for
  both, so such steps run alone. Each step's metrics reach the hooks'
  ``finished`` once, in order."""

  def __init__(self, run: Run):
    self._run = run
    self._waiting = []  # (step, metrics on the device), oldest first
    self._alone = True  # the first step runs alone: its time decides

  def add(self, step: int, metrics_) -> None:
    self._waiting.append((step, metrics_))
    if len(self._waiting) > 1:
      self._alone = self._alone or self._finish(keep=1) > SLOW_STEP_S
    if self._alone:
      self._alone = self._finish(keep=0) > SLOW_STEP_S

  def finish(self) -> None:
    """Waits for every step dispatched."""
    self._finish(keep=0)

  def _finish(self, keep: int) -> float:
    """Waits until only the newest ``keep`` steps are in flight; returns
    the seconds waited."""
    start = time.perf_counter()
    with self._run.clock.charged('step'):
      while len(self._waiting) > keep:
        step, metrics_ = self._waiting.pop(0)
        self._run.hooks.finished(self._run, step, jax.device_get(metrics_))
    return time.perf_counter() - start


def prepare_data(cfg: Experiment) -> data.PreparedData:
  """Builds the dataset once (process 0 first, the others then load it)."""
  def prepare():
    return data.prepare_for(cfg.data, seq_len=cfg.seq_len,
                            refuse_other_tokenizer=True)
  if jax.process_count() == 1:
    return prepare()
  if jax.process_index() == 0:
    try:
      prepared = prepare()
    except BaseException as err:
      # The others stop now with the reason, not at --data_timeout.
      distributed.send('data prepared',
                       f'{named_line(err)}')
      raise
    distributed.send('data prepared', 'ok')
    return prepared
  # Bounded by --data_timeout: building a corpus can take hours.
  outcome = distributed.receive('data prepared', kind='data')
  if outcome != 'ok':
    raise RuntimeError(f'Process 0 could not prepare the dataset ({outcome}),'
                       f' so process {jax.process_index()} stops too.')
  return prepare()


def check_data(cfg: Experiment, tokenizer) -> None:
  """The data pre-flight (data/preflight.py): a line per training source
  (examples kept, cut and dropped at the run's rows, loss tokens per
  batch), a warning where many are cut or dropped, and a refusal in one
  sentence where nothing would train, before the model is built."""
  reports = data.training_preflight(cfg.train_batches, tokenizer)
  for report in reports:
    log(report.line())
    warning = report.warning()
    if warning:
      log(warning)
  for report in reports:
    report.check()


def check_workdir(root, need_bytes: int, name: str) -> None:
  """storage.check_writable on every process (each writes its shards of a
  checkpoint), agreed: where one process cannot write, all stop at once."""
  who = (f' on process {jax.process_index()}' if jax.process_count() > 1
         else '')
  try:
    storage.check_writable(root, need_bytes, who)
  except UsageError as err:
    distributed.all_passed(name, str(err))
    raise
  distributed.all_passed(name)


def _state_bytes(abstract_state) -> int:
  """Bytes of the whole train state (about one checkpoint)."""
  return sum(x.size * x.dtype.itemsize
             for x in jax.tree.leaves(abstract_state))
