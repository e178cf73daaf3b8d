"""The planner's step-time model against measured steps on the devices at
hand (``scripts/benchmark.py --suite plan``).

On a GPU or TPU: ``config`` (default gpt2_small) is planned for the local
devices within ``budget_s`` and the planner's top three layouts are
measured. On CPU host devices: for each of ``sizes`` (``measure.HOST_SIZES``:
tiny, small, gpt2_small's width at 4 layers), its layouts (meshes, remat policies, a
chunked loss, accumulation; ``measure.host_check_layouts``). A row per
layout (predicted and measured seconds an update, their ratio), a summary
row per size and one over every row: the step model's version, Spearman's
rank correlation, the median and the worst (furthest from 1) ratio of
predicted to measured time, and whether the predicted fastest is the
measured fastest (within 10%: near-equal layouts trade places from run to
run on a shared host).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jax_transformer.compile import step_model
from jax_transformer.experiment import doors
from jax_transformer.plan import candidates as cands
from jax_transformer.plan import measure, search

VOCAB = 32768
TOP = 3
TIE = 1.10  # measured times this close count as the same


def _layouts_planned(cfg, where, budget_s: float) -> list[cands.Candidate]:
  rows = search.plan(cfg, 'plan suite', where, cfg.batch_size, budget_s,
                     cache_dir=None, vocab_size=VOCAB)
  fields = [f.name for f in dataclasses.fields(cands.Candidate)]
  return [cands.Candidate(**{k: r[k] for k in fields})
          for r in rows if r['rank']][:TOP]


def run(config: str | None = None, budget_s: float = 300,
        rounds: int = 5, sizes: tuple[str, ...] = tuple(measure.HOST_SIZES)
        ) -> list[dict]:
  where = search.Where.here()
  if where.platform != 'cpu' or config is not None:
    cfg = doors.load(config or 'gpt2_small')
    rows = _rows(cfg, _layouts_planned(cfg, where, budget_s), where,
                 VOCAB, rounds, config or 'gpt2_small')
    return rows + [summary(rows)]
  out, every = [], []
  for size in sizes:
    rows = _rows(measure.host_check_config(size),
                 measure.host_check_layouts(size), where, 512, rounds, size)
    out += rows + [summary(rows, size)]
    every += rows
  return out + [summary(every, 'all')] if len(sizes) > 1 else out


def _rows(cfg, layouts, where, vocab: int, rounds: int, size: str
          ) -> list[dict]:
  compared = measure.compare(cfg, layouts, where, vocab, rounds)
  return [{'suite': 'plan', 'device': jax.devices()[0].device_kind,
           'size': size, 'layout': r['layout'],
           'predicted_step_s': r['predicted_step_s'],
           'measured_step_s': r['measured_step_s'],
           'ratio': r['predicted_over_measured'],
           'predicted_mfu': r['predicted_mfu']} for r in compared]


def summary(rows: list[dict], size: str | None = None) -> dict:
  """Rank agreement of prediction and measurement over the rows (of one
  size, or 'all')."""
  predicted = [r['predicted_step_s'] for r in rows]
  measured = [r['measured_step_s'] for r in rows]
  pick = measured[predicted.index(min(predicted))]
  ratios = sorted(p / m for p, m in zip(predicted, measured))
  return {'suite': 'plan', 'size': size, 'layouts': len(rows),
          'cost_version': step_model.COST_VERSION,
          'spearman': measure.spearman(predicted, measured),
          'top_choice_agrees': pick <= TIE * min(measured),
          'top_choice_measured_over_best': pick / min(measured),
          'median_predicted_over_measured': float(np.median(ratios)),
          'worst_predicted_over_measured': max(ratios, key=lambda r: abs(
              np.log(r)))}
