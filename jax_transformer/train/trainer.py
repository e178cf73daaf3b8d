"""The training loop: mesh, sharded init, jitted steps, eval, checkpoints.

Everything impure lives here; the math is in ``steps.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from jax_transformer import data, decoding
from jax_transformer.decoding import sampling
from jax_transformer.errors import UsageError
from jax_transformer.model import sharding
from jax_transformer.runtime import distributed, faults, stall, storage
from jax_transformer.runtime.workdir import WorkdirPaths, resolve
from jax_transformer.train import (
  checkpoint,
  checks,
  evaluation,
  experiment,
  goodput,
  memory,
  optim,
  perf,
  profiling,
  steps,
)
from jax_transformer.train import metrics as metrics_lib
from jax_transformer.train.metrics import MetricWriter


def log(*args) -> None:
  if jax.process_index() == 0:
    print(*args, flush=True)


# Steps the host waits longer for than this run one at a time (see the
# loop), so that a stop signal waits for one step, not two.
SLOW_STEP_S = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the loop checks after
  each step: the run saves a checkpoint and stops."""

  def __init__(self):
    self.requested = None  # the name of the signal that asked to stop
    self._previous = {s: signal.signal(s, self._handle)
                      for s in STOP_SIGNALS}

  def _handle(self, signum, frame):
    del frame
    if self.requested:
      # A second signal ends a process that cannot reach its next step.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
    self.requested = signal.Signals(signum).name

  def should_stop(self, step: int, every: int = 10) -> bool:
    if jax.process_count() == 1:
      return self.requested
    # Every process must stop at the same step; agreeing costs a collective,
    # so hosts compare flags every few steps only.
    if step % every:
      return False
    flags = multihost_utils.process_allgather(np.array(bool(self.requested)))
    return bool(np.any(flags))

  def restore(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


def sync(name: str) -> None:
  """A barrier across processes (nothing to do for one), bounded by
  --barrier_timeout."""
  distributed.barrier(name)


def prepare_data(cfg: ml_collections.ConfigDict) -> data.PreparedData:
  """Builds the dataset once (process 0 first, the others then load it)."""
  def prepare():
    return data.prepare(cfg.data.name, cfg.data.get('data_dir'),
                        tokenizer=cfg.data.get('tokenizer'),
                        vocab_size=cfg.data.get('vocab_size'),
                        model_type=cfg.data.get('spm_model_type', 'unigram'),
                        builder_kwargs=cfg.data.get('builder_kwargs'))
  if jax.process_count() == 1:
    return prepare()
  if jax.process_index() == 0:
    try:
      prepared = prepare()
    except BaseException as err:
      # The others stop now with the reason, not at --data_timeout.
      reason = (str(err).strip().splitlines() or [''])[0]
      distributed.send('data prepared', f'{type(err).__name__}: {reason}')
      raise
    distributed.send('data prepared', 'ok')
    return prepared
  # Bounded by --data_timeout: building a corpus can take hours.
  outcome = distributed.receive('data prepared', kind='data')
  if outcome != 'ok':
    raise RuntimeError(f'Process 0 could not prepare the dataset ({outcome}),'
                       f' so process {jax.process_index()} stops too.')
  return prepare()


def evaluate(eval_step, params, cfg, tokenizer, mesh, setup=None, stop=None
             ) -> dict[str, float]:
  """Loss and perplexity over the validation split (or its first
  config.eval_steps batches); for translation also greedy BLEU and chrF on
  its first config.eval_bleu_examples sentences.

  stop(count) -> True (checked between batches) abandons the evaluation:
  raises evaluation.Interrupted.
  """
  metrics = evaluation.loss_metrics(eval_step, params, cfg, tokenizer, mesh,
                                    max_batches=cfg.get('eval_steps'),
                                    stop=stop)
  n = cfg.get('eval_bleu_examples') or 0
  if cfg.model_kind == 'encoder_decoder' and n > 0 and setup is not None:
    if stop is not None and stop(0):
      raise evaluation.Interrupted('stopped before the BLEU check')
    params = multihost_utils.process_allgather(params, tiled=True)
    metrics.update(evaluation.bleu_metrics(
        setup.model_def.merge(params), tokenizer, cfg, n,
        batch_size=cfg.eval_batch_size))
  return metrics


def sample(setup, params, tokenizer, cfg) -> str:
  """A sample from the trained model (LM: continues config.sample.prompt;
  translation: translates it), decoded to text."""
  params = multihost_utils.process_allgather(params, tiled=True)
  model = setup.model_def.merge(params)
  s = cfg.sample
  ids = tokenizer.encode(s.prompt)
  sampler = sampling.Sampler(s.temperature, s.top_k or None)
  key = jax.random.key(cfg.seed)
  if cfg.model_kind == 'encoder_decoder':
    out = decoding.generate(model, src_ids=[data.translation_source(ids)],
                            max_new_tokens=s.max_new_tokens, sampler=sampler,
                            key=key)
    return tokenizer.decode(decoding.row_tokens(out, 0))
  stream = data.get_spec(cfg.data.name).lm_mode == 'stream'
  out = decoding.generate(model, [data.lm_prompt(ids, stream)],
                          max_new_tokens=s.max_new_tokens, sampler=sampler,
                          key=key)
  return s.prompt + tokenizer.decode(decoding.row_tokens(out, 0))


def check_finite(metrics: dict, step: int, checkpointer,
                 max_skipped: int = 0) -> None:
  """Stops training at the first non-finite loss or gradient norm, or with
  max_skipped > 0 (optim.max_skipped_updates) once that many consecutive
  updates were skipped for one (``optim.skip_non_finite``).

  metrics: one step's (on the host); step: that step's number, counting
  from 1. Raises FloatingPointError naming the step and the checkpoint a
  rerun resumes from; the caller saves nothing after it.
  """
  if max_skipped:
    consecutive = int(metrics['consecutive_skips'])
    if consecutive < max_skipped:
      return
    problem = (f'The {consecutive} steps up to step {step} all had a '
               'non-finite loss or gradient norm and were skipped '
               f'(optim.max_skipped_updates={max_skipped}; '
               f'{int(metrics["skipped_updates"])} skipped since step 0)')
  else:
    values = {k: float(metrics[k]) for k in ('loss', 'grad_norm')}
    if all(np.isfinite(v) for v in values.values()):
      return
    problem = (f'Step {step} gave a non-finite loss sum or gradient norm '
               f'({values})')
  checkpointer.wait()
  last = checkpointer.latest_step()
  where = ('no checkpoint yet' if last is None
           else f'the last checkpoint is step {last}')
  raise FloatingPointError(
      f'{problem}; training stopped without saving it ({where}): lower '
      'optim.learning_rate or set optim.clip_norm, then rerun to resume.')


def train_and_evaluate(cfg: ml_collections.ConfigDict,
                       workdir: str | WorkdirPaths) -> dict[str, Any]:
  """Trains (resuming from workdir if it holds a checkpoint); returns the
  last logged metrics, with 'interrupted' (the signal's name) when SIGTERM
  or SIGINT stopped the run after saving."""
  # Everything that can be refused is, before any data is prepared (the
  # same on every process: no agreement needed).
  checks.check_run_fields(cfg)
  workdir = resolve(workdir)  # one value from here on: see runtime.workdir
  checks.check_resumable(cfg, workdir)
  mesh = checks.check_experiment(cfg)
  # Ends this process with one line if another one is lost (liveness.py).
  watchdog = distributed.watch(os.fspath(workdir.checkpoints))
  check_workdir(workdir.root, 0, 'workdir writable')
  checkpointer = checkpoint.Checkpointer(workdir, keep=cfg.keep_checkpoints)
  writer = MetricWriter(workdir, enabled=jax.process_index() == 0)
  try:
    last = _train(cfg, workdir, mesh, checkpointer, writer)
  finally:
    # Every exit path (finished, stopped, refused, failed): no save or
    # thread of this run outlives it.
    checkpointer.close()
    writer.close()
  if watchdog:  # not on an error: the others must see this process go
    watchdog.stop()
  return last


def _train(cfg: ml_collections.ConfigDict, workdir: WorkdirPaths, mesh,
           checkpointer: checkpoint.Checkpointer,
           writer: MetricWriter) -> dict[str, Any]:
  """train_and_evaluate after its checks, with the run's checkpointer and
  metrics writer (closed by the caller)."""
  clock = goodput.Clock()  # start-up until the loop
  main = jax.process_index() == 0
  root = workdir.root
  prepared = prepare_data(cfg)
  tokenizer = checkpoint.run_tokenizer(
      workdir, prepared.tokenizer, checkpointer.latest_step() is not None)
  setup = experiment.setup(cfg, tokenizer.vocab_size)

  abstract_state = setup.abstract_state(cfg.seed)
  shardings, param_specs = steps.state_shardings(setup, mesh, abstract_state)
  log(sharding.report(setup.abstract_params, setup.model_def.logical_axes,
                      param_specs, mesh))
  budget = memory.Budget.of(cfg)
  footprint = memory.estimate(cfg, setup.model_config, abstract_state,
                              shardings, mesh)
  log(memory.preflight(footprint, budget))
  check_workdir(root, _state_bytes(abstract_state), 'workdir has space')
  sync('workdir read')  # nobody reads tokenizer/ while process 0 writes it
  if main:
    checkpoint.save_side_files(workdir, cfg, tokenizer)

  train_iter = data.make_iterator(cfg.data,
                                  cfg.data.get('train_split', 'train'),
                                  tokenizer,
                                  batch_size=cfg.batch_size,
                                  seq_len=cfg.seq_len, seed=cfg.seed,
                                  worker_count=cfg.data.get('worker_count', 0),
                                  worker_buffer_size=cfg.data.get(
                                      'worker_buffer_size', 2))
  if checkpointer.latest_step() is not None:
    state, data_state = checkpointer.restore(
        steps.sharded_abstract(abstract_state, shardings))
    train_iter.set_state(data_state)
    log(f'Resumed from step {int(state["step"])} in {workdir}.')
  else:
    state = jax.jit(lambda: setup.init_state(cfg.seed),
                    out_shardings=shardings)()

  train_step = steps.jit_train_step(cfg, setup, mesh, shardings)
  eval_step = steps.jit_eval_step(cfg, setup, mesh, shardings)

  preemption = Preemption()
  profiler = profiling.Profiler(cfg, workdir, main)
  step = int(jax.device_get(state['step']))
  start_step, pending, last = step, [], {}
  rates = Throughput(cfg, setup.model_config)
  progress = _progress_bar(step, cfg.num_steps, main)
  # The first step runs alone: its time decides (see SLOW_STEP_S).
  compiled, previous, tick, alone = None, None, 0.0, True
  interrupted_eval = False
  max_skipped = cfg.optim.get('max_skipped_updates', 0)
  finished_now = step == cfg.num_steps > start_step
  # Ends this process if nothing progresses for config.step_timeout_s.
  watch = stall.StallWatch(cfg.get('step_timeout_s'),
                           os.fspath(workdir.checkpoints))
  evaluated = []  # whether this start has evaluated (compiled eval steps)

  def evaluate_at(at: int) -> dict[str, float]:
    """evaluate() after step ``at``, reporting progress between batches;
    unwatched the first time, which compiles the evaluation's steps."""
    def stop(count: int) -> bool:
      faults.reached('eval', at)
      watch.report()
      return preemption.should_stop(count)
    with (watch.paused() if not evaluated else contextlib.nullcontext(),
          clock.charged('eval')):
      try:
        return evaluate(eval_step, state['params'], cfg, tokenizer, mesh,
                        setup, stop=stop)
      finally:
        evaluated.append(at)

  try:
    if _is_eval_step(step, cfg) and _evaluation_abandoned(workdir, step):
      # A stop signal during this step's evaluation saved the step without
      # it: finish it now, as the uninterrupted run would have.
      try:
        row = _logged_row(workdir, step)
        row.update(evaluate_at(step))
        writer.write(step, row)  # replaces the row without evaluation
        last, finished_now = row, step == cfg.num_steps
        log(f'Finished the evaluation of step {step}, which a stop '
            'signal had interrupted.')
      except evaluation.Interrupted:
        last['interrupted'] = preemption.requested or 'another host'
    clock.switch('step')
    while step < cfg.num_steps and 'interrupted' not in last:
      faults.reached('data', step + 1)
      with clock.charged('data_wait'):
        batch = data.global_batch(next(train_iter), mesh)
      if compiled is None:
        faults.reached('compile', step + 1)
        with watch.paused(), clock.charged('compile'), \
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
          compiled, rates.compile_s = perf.compile_timed(train_step, state,
                                                         batch)
        log(f'Compiled the train step in {rates.compile_s:.1f} s.')
        # Before the first step, so a refusal never follows a new save.
        log(memory.after_compile(compiled, budget, footprint))
        # Hosts compile at different speeds, and the first step's
        # collectives give up on a late host after a fixed while (30 s for
        # CPU gloo): start it together.
        sync('train step compiled')
        tick = time.perf_counter()
      profiler.before_step(step + 1)
      state, metrics = compiled(state, batch)
      faults.reached('step', step + 1)
      pending.append(metrics)
      checkpointer.check_errors()  # a failed background save stops the run
      if previous is not None:
        # At most two steps in flight: the bar counts finished steps, and a
        # signal or a save never waits behind a backlog of dispatches.
        waited = time.perf_counter()
        check_finite(jax.device_get(previous), step, checkpointer,
                     max_skipped)
        # A slow step gains nothing from the next one queued behind it,
        # and a stop signal would wait for both: run such steps alone.
        alone = alone or time.perf_counter() - waited > SLOW_STEP_S
        watch.report()  # step `step` finished
        progress.update(1)
      previous = metrics
      if alone:
        waited = time.perf_counter()
        jax.block_until_ready(metrics)
        alone = time.perf_counter() - waited > SLOW_STEP_S
      step += 1
      if profiler.after_step(step, metrics):
        log(f'Wrote a profile of steps {profiler.written[-1][0]} to {step} '
            f'under {workdir.tensorboard}.')
      done = step == cfg.num_steps
      if step % cfg.log_every == 0 or done:
        sums = jax.device_get(pending)  # waits for the step just dispatched
        watch.report()
        clock.switch('other')
        now = time.perf_counter()
        progress.update(1)
        previous = None
        last = _summarise(sums, setup, cfg, step)
        last.update(rates.row(len(sums), last['target_tokens'], now - tick))
        pending = []
        if _is_eval_step(step, cfg):
          try:
            last.update(evaluate_at(step))
          except evaluation.Interrupted:
            # Saved below without this evaluation; a run resumed from this
            # step finishes it first.
            interrupted_eval = True
          if main and 'eval_loss' in last:
            bleu = (f', BLEU {last["eval_bleu"]:.2f}' if 'eval_bleu' in last
                    else '')
            progress.write(f'step {step}: train loss {last["loss"]:.4f}, '
                           f'eval loss {last["eval_loss"]:.4f}, perplexity '
                           f'{last["eval_perplexity"]:.2f}{bleu}')
        last.update(clock.row())
        writer.write(step, last)
        # previous is cleared: the next step will not check this one.
        check_finite(sums[-1], step, checkpointer, max_skipped)
        progress.set_postfix(loss=f'{last["loss"]:.3f}',
                             tok_s=f'{last["tokens_per_s"]:,.0f}')
        # Evaluation and logging are not training time.
        tick = time.perf_counter()
        clock.switch('step')
      stop = interrupted_eval or preemption.should_stop(step)
      if step % cfg.checkpoint_every == 0 or done or stop:
        # Never save a state a non-finite step produced.
        with clock.charged('checkpoint'):
          check_finite(jax.device_get(metrics), step, checkpointer,
                       max_skipped)
          checkpointer.save(state, train_iter.get_state())
        watch.report()
        faults.reached('save', step)
      if stop:
        last['interrupted'] = preemption.requested or 'another host'
        log(f'\n{last["interrupted"]}: saved step {step}; exiting to '
            'resume later.')
        break
  finally:
    progress.close()
    profiler.stop()
    train_iter.close()  # its worker processes end with the loop
    try:
      watch.report()  # the last save's wait is watched too
      with clock.charged('checkpoint'):
        checkpointer.wait()  # raises SaveFailed for a save that failed
    finally:
      watch.stop()
      checkpointer.close()  # before the sample: its threads end now
      preemption.restore()
  finished_now = finished_now or (step == cfg.num_steps > start_step)
  if finished_now and 'interrupted' not in last and cfg.sample.enabled:
    if preemption.requested:  # during the last save: exit now, finished
      log(f'{preemption.requested} after the last save: finished, without '
          'the sample.')
    else:
      with clock.charged('eval'):
        log('\nSample:\n' + sample(setup, state['params'], tokenizer, cfg))
  if step > start_step or evaluated:  # a start with nothing to do: no row
    _end_row(writer, workdir, step, clock.summary())
  return last


def _end_row(writer: MetricWriter, workdir: WorkdirPaths, step: int,
             summary: dict[str, float]) -> None:
  """The start's last metrics row: the last row logged so far again (a
  re-logged step replaces it, see metrics.read_history), with where the
  time went; and the summary line."""
  history = (metrics_lib.read_history(workdir)
             if writer.enabled and workdir.metrics.exists() else [])
  row = dict(history[-1]) if history else {'step': step}
  writer.write(row.pop('step'), {**row, **summary})
  log(goodput.describe(summary))


def _logged_row(workdir: WorkdirPaths, step: int) -> dict:
  """The metrics row of step (without its 'step' key), or {}."""
  if not workdir.metrics.exists():
    return {}
  rows = [r for r in metrics_lib.read_history(workdir) if r['step'] == step]
  return {k: v for k, v in rows[-1].items() if k != 'step'} if rows else {}


def _is_eval_step(step: int, cfg: ml_collections.ConfigDict) -> bool:
  """Whether step is evaluated after it (every eval_every, and the last);
  a step not logged (log_every) is not."""
  logged = step % cfg.log_every == 0 or step == cfg.num_steps
  return step > 0 and logged and (step % cfg.eval_every == 0
                                  or step == cfg.num_steps)


def _evaluation_abandoned(workdir: WorkdirPaths, step: int) -> bool:
  """Whether step's row was logged without its evaluation (a stop signal
  interrupted it), as process 0 reads metrics.jsonl; every process gets
  the same answer, since evaluating is collective."""
  abandoned = False
  if jax.process_index() == 0:
    row = _logged_row(workdir, step)
    abandoned = bool(row) and 'eval_loss' not in row
  return bool(multihost_utils.broadcast_one_to_all(np.int32(abandoned)))


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


class Throughput:
  """Rates over completed steps: step time, tokens/s and, where the
  device's peak is known (config.peak_tflops, or built in for H100, H200,
  A100 and TPUs), model FLOPs utilisation (see ``perf.py``)."""

  def __init__(self, cfg: ml_collections.ConfigDict, model_config):
    src_len = (cfg.data.get('src_len') or cfg.seq_len
               if model_config.num_encoder_layers else 0)
    self.step_flops = perf.step_flops(model_config, cfg.batch_size, src_len,
                                      cfg.seq_len)['train']
    peak = cfg.get('peak_tflops')
    peak = (peak * 1e12 if peak else
            perf.peak_flops(jax.devices()[0].device_kind))
    self.peak = None if peak is None else peak * jax.device_count()
    self.compile_s = None

  def row(self, steps_done: int, tokens: float, seconds: float
          ) -> dict[str, float]:
    """Rates of ``steps_done`` steps that took ``seconds`` end to end."""
    seconds = max(seconds, 1e-9)
    out = {'step_time_s': seconds / steps_done,
           'tokens_per_s': tokens / seconds,
           'model_tflops_per_s': self.step_flops * steps_done / seconds / 1e12}
    if self.peak:
      out['mfu'] = self.step_flops * steps_done / seconds / self.peak
    if self.compile_s is not None:  # once, in the first row
      out['compile_s'], self.compile_s = self.compile_s, None
    return out


def _summarise(sums, setup, cfg, step) -> dict[str, float]:
  """Losses per target token, the last gradient norm and learning rate."""
  tokens = sum(float(m['tokens']) for m in sums)
  updates = (step - 1) // int(cfg.optim.get('grad_accum_steps', 1))
  return {
      'loss': sum(float(m['loss']) for m in sums) / max(tokens, 1.0),
      'nll': sum(float(m['nll']) for m in sums) / max(tokens, 1.0),
      'grad_norm': float(sums[-1]['grad_norm']),
      'learning_rate': float(setup.schedule(updates)),
      # Target tokens since the last row; summed over rows, the tokens seen.
      'target_tokens': tokens,
      # Skipped updates (optim.skip_non_finite) as of the row's last step.
      **{k: float(sums[-1][k]) for k in optim.SKIP_COUNTERS
         if k in sums[-1]},
  }


def _progress_bar(initial: int, total: int, enabled: bool):
  return tqdm(total=total, initial=initial, disable=not enabled,
              dynamic_ncols=True, desc='train')
