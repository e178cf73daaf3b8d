"""Evaluation and the sample during training, as hooks (see hooks.py).

Every ``eval_every`` steps (and at the last) the loss and perplexity over
the validation split, and BLEU for translation, join that step's metrics
row; a stop signal between evaluation batches abandons it, and the next
start finishes it before training on. A run that reaches its last step
ends with a sample of the model's text.
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np
from jax.experimental import multihost_utils

from jax_transformer import data, decoding
from jax_transformer.data.batching import markers
from jax_transformer.decoding import inference, sampling
from jax_transformer.experiment import EvalConfig
from jax_transformer.runtime.workdir import WorkdirPaths
from jax_transformer.train import metrics as metrics_lib
from jax_transformer.train import scores


class Evaluation:
  """The periodic evaluation. evaluate: the function that evaluates (this
  module's ``evaluate``; tests pass a wrapped one); preemption: what a
  stop between batches asks (``preemption.Preemption``); watch: the stall
  watch, paused while the first evaluation compiles its steps."""
  part = 'eval'

  def __init__(self, config: EvalConfig, eval_step, preemption,
               watch, evaluate_fn=None):
    self._config = config
    self._eval_step = eval_step
    self._preemption = preemption
    self._watch = watch
    self._evaluate = evaluate_fn or evaluate
    self._compiled = False

  def start(self, run) -> None:
    """Finishes the evaluation of the step resumed from, when a stop
    signal had saved that step without it."""
    if not (self._config.due(run.step)
            and evaluation_abandoned(run.workdir, run.step)):
      return
    row = logged_row(run.workdir, run.step)
    try:
      row.update(self._evaluate_at(run))
    except scores.Interrupted:
      run.stop = self._preemption.reason
      return
    run.writer.write(run.step, row)  # replaces the row without evaluation
    run.row, run.finished_now = row, run.last
    run.log(f'Finished the evaluation of step {run.step}, which a stop '
            'signal had interrupted.')

  def row(self, run, row: dict) -> None:
    if not self._config.due(run.step):
      return
    try:
      row.update(self._evaluate_at(run))
    except scores.Interrupted:
      # Saved without this evaluation; a run resumed from this step
      # finishes it first (``start``).
      run.stop = self._preemption.reason

  def _evaluate_at(self, run) -> dict[str, float]:
    at = run.step

    def stop(count: int) -> bool:
      run.hooks.evaluating(run, at)
      return self._preemption.should_stop(count)

    compiling = (contextlib.nullcontext() if self._compiled
                 else self._watch.paused())
    with compiling:
      try:
        return self._evaluate(self._eval_step, run.state['params'],
                              self._config, run.tokenizer, run.mesh,
                              run.setup, stop=stop)
      finally:
        self._compiled = True


class Sample:
  """The sample a finished run ends with (config.sample)."""
  part = 'eval'

  def __init__(self, config: EvalConfig, preemption):
    self._config = config
    self._preemption = preemption

  def completed(self, run) -> None:
    if not (run.finished_now and run.stop is None
            and self._config.sample.enabled):
      return
    if self._preemption.requested:  # during the last save: exit now
      run.log(f'{self._preemption.requested} after the last save: finished, '
              'without the sample.')
      return
    run.log('\nSample:\n' + sample(run.setup, run.state['params'],
                                    run.tokenizer, self._config))


def evaluate(eval_step, params, config: EvalConfig, tokenizer, mesh,
             setup=None, stop=None) -> dict[str, float]:
  """Loss and perplexity over the validation split (or its first
  config.max_batches batches; for a mixture, over each source's and all
  of them together); for a model with a source side (translation) also
  greedy BLEU and chrF on its first config.bleu_examples sentences.

  stop(count) -> True (checked between batches) abandons the evaluation:
  raises scores.Interrupted.
  """
  score = (scores.mixture_loss_metrics if config.data.mixture
           else scores.loss_metrics)  # per source too (a mixture)
  metrics = score(eval_step, params, config.data, tokenizer, mesh,
                  (config.batch_size, config.seq_len),
                  max_batches=config.max_batches, stop=stop)
  n = config.bleu_examples
  if config.family.has_source and n > 0 and setup is not None:
    if stop is not None and stop(0):
      raise scores.Interrupted('stopped before the BLEU check')
    params = multihost_utils.process_allgather(params, tiled=True)
    metrics.update(scores.bleu_metrics(
        setup.model_def.merge(params), tokenizer, config.data, n,
        batch_size=config.batch_size))
  return metrics


# The most characters of a validation document a prompt takes (an LM's).
DATA_PROMPT_CHARS = 40


def data_prompt(config: EvalConfig) -> str:
  """The prompt of a run whose config.sample.prompt is empty (train.py
  empties the recipe's for a run on other data than the recipe's): the
  start of the first document of its evaluation split, its first line
  (an LM's cut at a space within DATA_PROMPT_CHARS); '' where there is
  none (instruction data, or a split that cannot be read)."""
  try:
    spec = data.spec_for(config.data)
    if tuple(spec.text_features) == ('prompt', 'completion'):
      return ''
    source = data.load_source(spec, config.data.eval_split or 'validation',
                              config.data.data_dir)
    text = data.datasets.as_text(source[0][spec.text_features[0]])
  except Exception:  # pylint: disable=broad-except
    return ''
  line = next((s.strip() for s in text.splitlines() if s.strip()), '')
  # A source sentence is kept whole: its translation is the sample.
  if config.family.has_source or len(line) <= DATA_PROMPT_CHARS:
    return line
  return line[:DATA_PROMPT_CHARS].rsplit(' ', 1)[0] or line[
      :DATA_PROMPT_CHARS]


def sample(setup, params, tokenizer, config: EvalConfig) -> str:
  """A sample from the trained model (LM: continues config.sample.prompt;
  translation: translates it), decoded to text. An empty prompt is the
  start of a validation document (``data_prompt``)."""
  params = multihost_utils.process_allgather(params, tiled=True)
  model = setup.model_def.merge(params)
  s = config.sample
  prompt = s.prompt or data_prompt(config)
  ids = tokenizer.encode(prompt)
  bos, eos = markers(tokenizer)  # the tokenizer's own, as in its batches
  sampler = sampling.Sampler(s.temperature, s.top_k or None)
  key = jax.random.key(config.seed)
  if config.family.has_source:
    source = [data.translation_source(ids, eos)]
    out = decoding.generate(model, **config.family.prompt_inputs(source),
                            max_new_tokens=s.max_new_tokens, sampler=sampler,
                            key=key)
    return tokenizer.decode(decoding.row_tokens(out, 0))
  stream = inference.streamed(config.data)
  # Nothing to continue: a stream starts a document after an EOS.
  row = data.lm_prompt(ids, stream, bos) or [eos]
  out = decoding.generate(model, [row], max_new_tokens=s.max_new_tokens,
                          sampler=sampler, key=key)
  return prompt + tokenizer.decode(decoding.row_tokens(out, 0))


def evaluation_abandoned(workdir: WorkdirPaths, step: int) -> bool:
  """Whether step's row was logged without its evaluation (a stop signal
  interrupted it), as process 0 reads metrics.jsonl; every process gets
  the same answer, since evaluating is collective."""
  abandoned = False
  if jax.process_index() == 0:
    row = logged_row(workdir, step)
    abandoned = bool(row) and 'eval_loss' not in row
  return bool(multihost_utils.broadcast_one_to_all(np.int32(abandoned)))


def logged_row(workdir: WorkdirPaths, step: int) -> dict:
  """The metrics row of step (without its 'step' key), or {}."""
  if not workdir.metrics.exists():
    return {}
  rows = [r for r in metrics_lib.read_history(workdir) if r['step'] == step]
  return {k: v for k, v in rows[-1].items() if k != 'step'} if rows else {}
