"""lm-eval tasks scored while training runs (``config.eval_harness``), as a
trainer hook (``train/hooks.py``).

The tasks are found and their data loaded when the hook is made, before
the run prepares data or compiles: an unknown task or unreachable data is
one sentence then. At every ``eval_harness.every`` steps (default: every
evaluation) and at the last step, the run's current parameters, where
they are on the run's mesh, are scored; the metrics join that step's row
(``metrics.jsonl`` and TensorBoard) as ``harness/<task>/<metric>``, and the
time is the goodput's evaluation part; each batch scored is an
``evaluating`` moment, which the stall watch hears. Every process of a
multi-host run runs the same requests (each batch split over the mesh's
batch axes, the answers gathered to every process); process 0 prints
lm-eval's table.
"""

from __future__ import annotations

from jax_transformer import fields
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.harness import backend, tasks
from jax_transformer.model import families
from jax_transformer.workdirs import restore


def settings_of(cfg: Experiment) -> tasks.Settings | None:
  """The tasks config.eval_harness asks for (None: none)."""
  h = cfg.eval_harness
  if not h.tasks.strip():
    return None
  if h.every is not None:
    fields.check_integer('config.eval_harness.every', h.every)
  if h.every is not None and h.every % cfg.log_every:
    raise UsageError(f'config.eval_harness.every={h.every} is not a multiple '
                     f'of config.log_every={cfg.log_every}: tasks are scored '
                     'into a metrics row, which comes every log_every steps.')
  if h.batch_size is not None:
    fields.check_integer('config.eval_harness.batch_size', h.batch_size)
  if families.family(cfg.model_kind).has_source:
    raise UsageError('config.eval_harness scores decoder-only language '
                     'models; an encoder-decoder is scored by the run\'s '
                     'own evaluation (BLEU and chrF).')
  return tasks.Settings(tasks.parse_tasks(h.tasks), h.num_fewshot,
                        tasks.parse_limit(h.limit), h.include_path,
                        cfg.seed, bootstrap_iters=0)


class HarnessEvaluation:
  """Scores config.eval_harness's tasks at its steps (a hook)."""
  part = 'eval'

  def __init__(self, cfg: Experiment, settings: tasks.Settings):
    self._cfg = cfg
    self._settings = settings
    self._every = cfg.eval_harness.every or cfg.eval_every
    self._batch_size = cfg.eval_harness.batch_size or cfg.eval_batch_size
    self._loaded = tasks.load_tasks(settings)
    tasks.check_fits(cfg.model.max_len, self._loaded[1],
                     backend.DEFAULT_MAX_GEN_TOKS)

  def due(self, step: int, last: bool) -> bool:
    return step > 0 and (step % self._every == 0 or last)

  def row(self, run, row: dict) -> None:
    if not self.due(run.step, run.last):
      return
    trained = restore.Trained(run.setup.model_def.merge(run.state['params']),
                              run.tokenizer, self._cfg, run.step, run.mesh)
    # Every batch tells the hooks (the stall watch) the run is alive.
    lm = backend.JaxTransformerLM(
        trained, self._batch_size, seed=self._cfg.seed,
        heartbeat=lambda: run.hooks.evaluating(run, run.step))
    results = tasks.evaluate(lm, self._settings, self._loaded)
    run.log(f'lm-eval tasks at step {run.step}:\n{tasks.table(results)}')
    row.update({f'harness/{k}': v for k, v in tasks.metrics(results).items()})


def hooks_for(cfg: Experiment) -> list:
  """[the hook] where config.eval_harness names tasks, else []."""
  settings = settings_of(cfg)
  return [] if settings is None else [HarnessEvaluation(cfg, settings)]
