"""The docs' tables of measured figures, made from the benchmark record.

    python scripts/report.py           # rewrite README's and performance.md's
    python scripts/report.py --check   # exit 1 where a table is not the record's

Every figure of ``jax_transformer/bench/documented.py`` is read from the
newest record of its suite in ``docs/records/measured.jsonl`` (which
``scripts/benchmark.py``, ``scripts/benchmark_decode.py`` and
``scripts/soak.py --hard_kills`` append to), with the commit and machine
it was measured on: README's table the newest of all, performance.md's
the newest on each machine the record names; one that no record holds
is left out, one whose measured files changed after its record's commit
is marked stale. The tables sit between the ``<!-- measured:begin -->``
and ``<!-- measured:end -->`` lines of README.md and docs/performance.md.

README's table of predictions (``<!-- predicted:begin -->`` ...
``<!-- predicted:end -->``) is made the same way from
``docs/records/predicted.jsonl`` (``compile_at_size.py --target T
--config C --record``): the step model's MFU for each shipped config on
each target, stale where the step model's version or the files it
reads changed since the compile.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from jax_transformer.bench import documented, record

BEGIN, END = '<!-- measured:begin -->', '<!-- measured:end -->'
PREDICTED = '<!-- predicted:begin -->', '<!-- predicted:end -->'
README = record.ROOT / 'README.md'
PERFORMANCE = record.ROOT / 'docs' / 'performance.md'


def found(records):
  """(figure, record, value) of every documented figure a record holds."""
  for figure in documented.FIGURES:
    hit = documented.newest(records, figure)
    if hit:
      yield figure, *hit


def found_per_machine(records):
  """(figure, record, value) of every documented figure on each machine
  the record names: its newest record there."""
  for figure in documented.FIGURES:
    for rec, got in documented.newest_per_machine(records, figure):
      yield figure, rec, got


def readme_table(records) -> str:
  lines = ['| what | measured | commit, machine | command |',
           '|---|---|---|---|']
  for figure, rec, got in found(records):
    if figure.readme:
      lines.append(f'| {figure.what} | {documented.cell(figure, rec, got)} '
                   f"| `{(rec['commit'] or '?')[:7]}`, {rec['date']}, "
                   f"{documented.machine_text(rec['machine'])} "
                   f'| `{figure.command}` |')
  return '\n'.join(lines)


def performance_table(records) -> str:
  lines = ['| what | measured | rounds, load | commit | machine | date | '
           'command | details |', '|---|---|---|---|---|---|---|---|']
  for figure, rec, got in found_per_machine(records):
    load = '-'.join(f'{x:.1f}' for x in (rec['load_before'],
                                          rec['load_after'])
                    if x is not None)
    lines.append(
        f'| {figure.what} | {documented.cell(figure, rec, got)} '
        f"| {got['n']}, load {load or '?'} | `{(rec['commit'] or '?')[:7]}` "
        f"| {documented.machine_text(rec['machine'])} | {rec['date']} "
        f'| `{figure.command}` | {figure.details} |')
  return '\n'.join(lines)


def predicted_table(predictions) -> str:
  lines = ['| target | ' + ' | '.join(
      f'`{c}` (links\' share of the step)' for c in documented.PREDICTED_CONFIGS)
      + ' | compiled |', '|---|' + '---:|' * len(
          documented.PREDICTED_CONFIGS) + '---|']
  for target in documented.PREDICTED_TARGETS:
    cells, compiled = [], set()
    for config in documented.PREDICTED_CONFIGS:
      hit = documented.newest_prediction(predictions, target, config)
      if hit is None:
        cells.append('no record')
        continue
      rec, row = hit
      cells.append(documented.prediction_cell(rec, row))
      compiled.add(f"`{(rec['commit'] or '?')[:7]}`, {rec['date']}")
    lines.append(f'| {target} | ' + ' | '.join(cells) + ' | '
                 + '; '.join(sorted(compiled)) + ' |')
  return '\n'.join(lines)


def predictions_detail(predictions) -> str:
  """performance.md's table: each prediction with its figures."""
  lines = ['| config | target | per chip (compiler) | predicted ms a step '
           '| predicted MFU (links\' share) | compiled |',
           '|---|---|---:|---:|---:|---|']
  for config in documented.PREDICTED_CONFIGS:
    for target in documented.PREDICTED_TARGETS:
      hit = documented.newest_prediction(predictions, target, config)
      if hit is None:
        lines.append(f'| `{config}` | `{target}` | no record | | | |')
        continue
      rec, row = hit
      lines.append(
          f"| `{config}` | `{target}` | {row['per_chip_bytes'] / 1e9:.1f} GB "
          f"| {row['predicted_step_s'] * 1e3:.0f} "
          f'| {documented.prediction_cell(rec, row)} '
          f"| `{(rec['commit'] or '?')[:7]}`, {rec['date']}, step model "
          f"v{row['cost_version']} |")
  return '\n'.join(lines)


def with_table(text: str, table: str, path: pathlib.Path,
               markers: tuple[str, str] = (BEGIN, END)) -> str:
  """text with what lies between its markers replaced by table."""
  begin, end = markers
  if begin not in text or end not in text:
    raise SystemExit(f'{path} has no {begin} ... {end} lines.')
  head, rest = text.split(begin, 1)
  _, tail = rest.split(end, 1)
  return f'{head}{begin}\n{table}\n{end}{tail}'


def made(records=None, predictions=None) -> dict[pathlib.Path, str]:
  """Each doc as the records make it."""
  records = record.read() if records is None else records
  predictions = (record.read(record.PREDICTED) if predictions is None
                 else predictions)
  readme = with_table(README.read_text(), readme_table(records), README)
  performance = with_table(PERFORMANCE.read_text(),
                           performance_table(records), PERFORMANCE)
  return {README: with_table(readme, predicted_table(predictions), README,
                             PREDICTED),
          PERFORMANCE: with_table(performance,
                                  predictions_detail(predictions),
                                  PERFORMANCE, PREDICTED)}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--check', action='store_true',
                 help='change nothing; exit 1 where a table differs')
  args = p.parse_args(argv)
  differ = []
  for path, text in made().items():
    if path.read_text() != text:
      differ.append(path)
      if not args.check:
        path.write_text(text)
  rel = ', '.join(str(p.relative_to(record.ROOT)) for p in differ)
  if args.check:
    if differ:
      print(f'{rel}: the measured table is not the record\'s; run python '
            'scripts/report.py.', file=sys.stderr)
    return 1 if differ else 0
  print(f'Rewrote {rel}.' if differ else 'Tables already the record\'s.')
  return 0


if __name__ == '__main__':
  sys.exit(main())
