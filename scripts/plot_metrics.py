"""Plot the training curves of one or more runs into one picture.

    python scripts/plot_metrics.py runs/base runs/big --out curves.png

Reads each WORKDIR/metrics.jsonl (what the trainer writes; a resumed run's
repeated steps count once) and draws, one colour per run, train loss (solid)
and eval loss (dashed, dots at the evaluations) and, where logged, eval BLEU,
against steps (top row) and against target tokens seen (bottom row: the sum
of the trainer's ``target_tokens``), and where the runs' time went: one bar
per run of start-up, compile, data waits, steps, checkpoints, evaluation
and restarts, summed over every start of the workdir, with its goodput
(also printed, a line per run). Train loss is the cross-entropy without
label smoothing (``nll``), the quantity ``eval_loss`` measures. Workdirs
may be local or ``gs://``, and so may ``--out``. A workdir without metrics
is one sentence on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import NamedTuple, Sequence

from jax_transformer import cli
from jax_transformer.errors import UsageError
from jax_transformer.runtime import storage
from jax_transformer.runtime.workdir import resolve
from jax_transformer.train import goodput, metrics

PROG = 'plot_metrics.py'
# (panel title, [(metric key, line style, legend name)]); the first key of
# a pair that a row holds is used, so older runs without nll show loss.
PANELS = (
    ('loss', ((('nll', 'loss'), '-', 'train'),
              (('eval_loss',), '--', 'eval'))),
    ('BLEU', ((('eval_bleu',), '--', 'eval'),)),
)


class Run(NamedTuple):
  name: str
  rows: list[dict]
  tokens: list[float] | None  # cumulative target tokens per row
  time: dict | None  # goodput.across_starts of its starts' last rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = cli.ArgumentParser(
      prog=PROG,
      description='Plot train/eval loss and BLEU of training runs against '
                  'steps and tokens seen.')
  p.add_argument('workdirs', nargs='+', metavar='WORKDIR',
                 help='training directories (each holds metrics.jsonl)')
  p.add_argument('--out', required=True, metavar='FILE.png',
                 help='the picture to write (its suffix picks the format)')
  return p.parse_args(argv)


def load_run(workdir: str, name: str) -> Run:
  """A workdir's metrics, local or gs:// as training accepts it."""
  storage.check_reachable(workdir, 'WORKDIR')  # a gs:// bucket, at once
  paths = resolve(workdir, 'WORKDIR')
  if not paths.root.is_dir():
    raise UsageError(f'{workdir} is not a directory.')
  if not paths.metrics.exists():
    raise UsageError(f'{workdir} has no metrics.jsonl; is it a training '
                     'directory that has logged a step?')
  rows = metrics.read_history(paths)
  if not rows:
    raise UsageError(f'{workdir}/metrics.jsonl holds no rows yet.')
  tokens = None
  if all('target_tokens' in row for row in rows):
    total, tokens = 0.0, []
    for row in rows:
      total += row['target_tokens']
      tokens.append(total)
  # Every start's last row holds its times (train/goodput.py).
  ends = [r for r in metrics.read_jsonl(paths) if 'goodput' in r]
  return Run(name, rows, tokens, goodput.across_starts(ends) if ends else None)


def run_names(workdirs: Sequence[str]) -> list[str]:
  """Each workdir's last path component, or the whole path where two
  workdirs share it."""
  names = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  return [n if names.count(n) == 1 else w for n, w in zip(names, workdirs)]


def has(run: Run, keys: Sequence[str]) -> bool:
  return any(k in row for row in run.rows for k in keys)


def series(run: Run, keys: Sequence[str], x: Sequence[float]):
  """(xs, ys) of the rows holding one of keys."""
  points = []
  for row, xi in zip(run.rows, x):
    key = next((k for k in keys if k in row), None)
    if key is not None:
      points.append((xi, row[key]))
  return [p[0] for p in points], [p[1] for p in points]


def plot(runs: Sequence[Run], out: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  panels = [(title, lines) for title, lines in PANELS
            if any(has(r, keys) for r in runs for keys, _, _ in lines)]
  axes_x = [('step', lambda r: [row['step'] for row in r.rows])]
  if any(r.tokens for r in runs):
    axes_x.append(('target tokens seen', lambda r: r.tokens))
  timed = [r for r in runs if r.time]
  fig, axes = plt.subplots(len(axes_x) + bool(timed), len(panels),
                           squeeze=False,
                           figsize=(6 * len(panels) + 2,
                                    4 * len(axes_x) + 2 * bool(timed)),
                           layout='constrained')
  if timed:
    for ax in axes[-1][1:]:
      ax.set_visible(False)
    time_bars(axes[-1][0], timed)
  for i, (xlabel, xs_of) in enumerate(axes_x):
    for j, (title, lines) in enumerate(panels):
      ax = axes[i][j]
      for c, run in enumerate(runs):
        x = xs_of(run)
        if x is None:
          continue
        for keys, style, _ in lines:
          xs, ys = series(run, keys, x)
          ax.plot(xs, ys, style, color=f'C{c % 10}',
                  marker='.' if style == '--' else None)
      ax.set_xlabel(xlabel)
      ax.set_title(title)
      ax.grid(alpha=0.3)
  handles = [Line2D([], [], color=f'C{c % 10}', label=run.name)
             for c, run in enumerate(runs)]
  handles += [Line2D([], [], color='gray', linestyle=style, label=name)
              for name, style in (('train', '-'), ('eval', '--'))]
  fig.legend(handles=handles, loc='outside right upper')
  picture = io.BytesIO()
  try:  # the format from out's suffix, as savefig(out) picks it
    fig.savefig(picture, dpi=100,
                format=os.path.splitext(out)[1][1:].lower() or None)
  except ValueError as e:  # an unknown format
    raise UsageError(f'--out {out}: {e}') from None
  finally:
    plt.close(fig)
  storage.path(out, '--out').write_bytes(picture.getvalue())


TIME_PARTS = ('startup', 'compile', 'restarts', 'data_wait', 'step',
              'checkpoint', 'eval', 'other')


def time_bars(ax, runs: Sequence[Run]) -> None:
  """One horizontal bar per run: its wall time split into parts."""
  for i, run in enumerate(runs):
    left = 0.0
    for c, part in enumerate(TIME_PARTS):
      width = run.time.get(f'total_{part}_s', 0.0)
      ax.barh(i, width, left=left, color=f'C{c}',
              label=part.replace('_', ' ') if i == 0 else None)
      left += width
  ax.set_yticks(range(len(runs)),
                [f'{r.name} ({r.time["goodput"]:.0%})' for r in runs])
  ax.set_xlabel('seconds, all starts (goodput)')
  ax.set_title('where the time went')
  ax.legend(fontsize='small', ncols=4, loc='upper center',
            bbox_to_anchor=(0.5, -0.35))


@cli.entry_point(PROG)
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  folder = storage.path(args.out, '--out').parent
  if not folder.is_dir():
    raise UsageError(f'--out {args.out}: the folder {folder} does not '
                     'exist.')
  runs = [load_run(w, n)
          for w, n in zip(args.workdirs, run_names(args.workdirs))]
  for run in runs:
    if run.tokens is None:
      print(f'{PROG}: {run.name} logs no target_tokens (older trainer); it '
            'is left out of the tokens row.', file=sys.stderr)
  for run in runs:
    if run.time:
      print(f'{run.name}, {run.time["starts"]} start(s): '
            f'{goodput.describe(run.time)}')
  plot(runs, args.out)
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
