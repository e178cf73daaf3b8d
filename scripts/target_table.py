"""The docs' table of configs on TPU pods and GPUs, made by one command.

    python scripts/target_table.py                     # every pair below
    python scripts/target_table.py --configs lm_1_3b --targets v5p-128

    python scripts/target_table.py --configs lm_350m --targets v5e-256 \
        --layouts shipped,planner --nolargest_batch

Each (config, target) pair is compiled by ``compile_at_size.py --target``
in a process of its own (a GPU target must be the first thing a process
compiles for) at the rows a run would take (``ROWS_PER_STEP``), in the
config's own layout and/or (``--layouts planner``) the one
``scripts/plan.py`` finds fastest. The rows go to --output as JSON
lines; the table (markdown) to stdout: per-chip memory by the target's
compiler against the chip's, the pre-flight estimate's ratio to it,
compile time, collective bytes per chip and step, the step model's
predicted MFU (its cost version in the header) with what limits it and
the share of link time, and the largest global batch that fits (per-chip
memory is affine in the batch: a second compile at half or twice the
batch gives its slope), and whether the compilers' overlap options were
on (``runtime/xla_options.py``). A GPU pair that does not fit one host is
compiled again for eight hosts (h100-64, h200-64). A pair that fails to
compile is a line under the table saying why, never a cell. Needs ``pip
install -e '.[aot]'`` (and the GPU compiler for h100/h200 targets, see
docs/scaling.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from absl import flags

from jax_transformer import cli
from jax_transformer.compile import flags as target_flags
from jax_transformer.errors import UsageError
from jax_transformer.runtime import targets

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = ('wmt_base', 'wmt_base:big', 'gpt2_small', 'lm_350m', 'lm_1_3b',
           'lm_7b')
TARGETS = ('v5e-256', 'v5p-128', 'v6e-256', 'h100-8')
# The rows each model is compiled at: the language models at about a
# million tokens a step (the scale they are trained at: 1024 rows of 1024,
# 512 of 2048); translation at the paper's ~25k source and ~25k target
# tokens a batch (the shipped 128 packed rows of 256). Rounded up to a row
# per chip, unless tensor parallelism can take the chips a row short
# (``mesh_flags``).
ROWS_PER_STEP = {'gpt2_small': 1024, 'lm_350m': 1024, 'lm_1_3b': 1024,
                 'lm_7b': 512}
GB = 1e9
# A failed compile's stderr: the exception's own line (dotted names too,
# jax.errors.JaxRuntimeError), not JAX's note on filtered frames after it.
_RAISED = re.compile(r'^[\w.]*(Error|Exception|Exhausted)\b.*?: ')
_NOTES = ('For simplicity, JAX has removed', '----')


def parse_args(argv=None):
  """The flag values of argv (the flags, without the program)."""
  values = flags.FlagValues()
  flags.DEFINE_list('configs', list(CONFIGS), 'comma-separated NAME[:preset]',
                    flag_values=values)
  flags.DEFINE_list('targets', list(TARGETS),
                    'comma-separated, of ' + ', '.join(targets.TARGETS),
                    flag_values=values)
  flags.DEFINE_float('timeout', 1800, 'seconds one compile may take',
                     flag_values=values)
  flags.DEFINE_list('layouts', ['shipped'], "'shipped' (the config's own "
                    "layout) and/or 'planner' (the layout scripts/plan.py "
                    'finds fastest at the same rows, within --plan_budget_s)',
                    flag_values=values)
  flags.DEFINE_float('plan_budget_s', 900, 'seconds the planner may take '
                     'for one pair', flag_values=values)
  flags.DEFINE_bool('largest_batch', True, 'compile each pair a second time '
                    'for its largest batch', flag_values=values)
  flags.DEFINE_bool('train_only', False, 'compile the train step alone (not '
                    'the eval step and the decode: about half the time)',
                    flag_values=values)
  target_flags.define_output(values)
  argv = sys.argv[1:] if argv is None else list(argv)
  target_flags.parse('target_table.py', argv, values, __doc__, config='never')
  for name in values.targets:
    if name not in targets.TARGETS:
      raise UsageError(f'--targets: unknown {name}; choose from '
                       f'{", ".join(targets.TARGETS)}.')
  for spec in values.configs:
    cli.config_path(spec.partition(':')[0])  # a missing one: one line
  unknown = set(values.layouts) - {'shipped', 'planner'}
  if unknown or not values.layouts:
    raise UsageError(f'--layouts takes shipped and planner, got '
                     f'{",".join(values.layouts)}.')
  return values


def compile_pair(config: str, target: str, timeout: float,
                 *flags: str) -> dict:
  """compile_at_size.py's row for one pair, or a row with 'error'."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', TPU_SKIP_MDS_QUERY='1')
  try:
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, 'compile_at_size.py'),
         '--target', target, '--config', config, *flags],
        env=env, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {'config': config, 'target': target,
            'error': f'no compile within {timeout:.0f} s'}
  if out.returncode:
    return {'config': config, 'target': target,
            'error': failure(out.stderr)}
  return json.loads(out.stdout.strip().splitlines()[-1])


def failure(stderr: str) -> str:
  """Why a compile failed, in one line: the exception raised (its last
  line that names one), else the last line that is not one of JAX's
  notes."""
  lines = [line.strip() for line in stderr.strip().splitlines()
           if line.strip()]
  raised = [line for line in lines if _RAISED.match(line)]
  told = [line for line in lines if not line.startswith(_NOTES)]
  return (raised or told or ['(no output)'])[-1]


def largest_batch(row: dict, timeout: float, *extra: str) -> int | None:
  """The largest global batch that fits a chip, a multiple of the batch
  shards, from row's per-chip bytes and a second compile's (with the
  compile_at_size.py flags ``extra``)."""
  shipped = row['batch_size']
  shards = row['mesh']['data'] * row['mesh']['fsdp']
  half = shipped // 2
  other = half if half and half % shards == 0 else 2 * shipped
  second = compile_pair(row['config'], row['target'], timeout,
                        f'--config.batch_size={other}',
                        f'--config.eval_batch_size={other}',
                        *row.get('layout_flags', ()), *extra)
  need, need2 = row['per_chip_bytes'], second.get('per_chip_bytes')
  if not need or not need2:
    return None
  per_row = (need - need2) / (shipped - other)
  if per_row <= 0:  # the compiler laid the other batch out differently
    return None
  fixed = need - per_row * shipped
  rows = (row['chip_memory_bytes'] - fixed) / per_row
  return max(0, int(rows // shards) * shards)


def _cell(text) -> str:
  """A table cell: one line, no column bar."""
  return ' '.join(str(text).split()).replace('|', '/')


def markdown(rows: list[dict]) -> str:
  """The rows as the docs' table; a pair that failed to compile is a line
  under the table saying why, never a cell."""
  version = next((r['cost_version'] for r in rows if 'cost_version' in r),
                 '?')
  lines = ['| config | target | layout | mesh | rows x tokens '
           '| per chip (compiler) | fits | largest batch | estimate / compiler '
           '| compile | collectives / chip | predicted MFU, cost version '
           f'{version} (limited by; links) '
           '| attention | XLA overlap |',
           '|---|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---|---|']
  failed = []
  for r in rows:
    if 'error' in r:
      failed.append(f'- `{r["config"]}` on `{r["target"]}` did not compile: '
                    f'{_cell(r["error"])}')
      continue
    mesh = ' x '.join(f'{k} {v}' for k, v in r['mesh'].items() if v > 1)
    need = r['per_chip_bytes'] or 0
    ratio = f'{r["estimate_bytes"] / need:.2f}x' if need else '-'
    mfu = (f'{r["predicted_mfu"]:.0%} ({limit(r)}; '
           f'{r.get("link_share", 0):.0%})'
           if r.get('predicted_mfu') is not None else '-')
    fits = 'yes' if r['fits'] else f'no (+{r["over_by_bytes"] / GB:.1f} GB)'
    largest = r.get('largest_batch')
    moved = r.get('collective_bytes')
    moved = f'{sum(moved.values()) / GB:.1f} GB' if moved else '-'
    overlap = r.get('xla_options', '-').removeprefix('XLA overlap: ')
    overlap = 'on' if '(' in overlap else overlap
    cells = [f'`{r["config"]}`', f'`{r["target"]}`',
             r.get('layout', 'shipped'), mesh or '1',
             f'{r["batch_size"]} x {r["seq_len"]}',
             f'{need / GB:.1f} of {r["chip_memory_bytes"] / GB:.1f} GB', fits,
             largest if largest is not None else '-', ratio,
             f'{r["compile_s"]:.0f} s', moved, mfu, r['attention_kernel'],
             overlap]
    lines.append('| ' + ' | '.join(_cell(c) for c in cells) + ' |')
  return '\n'.join(lines + ([''] + failed if failed else []))


def limit(row: dict) -> str:
  """What takes most of the row's predicted step: compute, HBM or links."""
  parts = {'compute': row.get('compute_bound_s') or 0,
           'HBM': row.get('hbm_bound_s') or 0,
           'links': row.get('link_bound_s') or 0}
  return max(parts, key=parts.get)


@cli.entry_point('target_table.py')
def main(argv=None) -> int:
  args = parse_args(argv)
  rows = []
  for target in args.targets:
    for config in args.configs:
      for row in (r for layout in args.layouts
                  for r in pair_rows(config, target, args.timeout,
                                     args.largest_batch, layout,
                                     args.plan_budget_s, args.train_only)):
        print(f'{config} on {row["target"]}: '
              f'{row.get("error") or "compiled"}', file=sys.stderr,
              flush=True)
        rows.append(row)
        if args.output:
          with open(args.output, 'a') as f:
            f.write(json.dumps(row) + '\n')
  print(markdown(rows))
  return 0


def table_batch(config: str, target: str) -> int:
  """The global batch a pair is compiled at (see ROWS_PER_STEP): the
  intended rows, or a row per chip where tensor parallelism cannot take
  the chips a row short."""
  rows = intended_rows(config)
  if mesh_flags(config, target):
    return rows
  chips = targets.target(target).chips
  return -(-rows // chips) * chips


def intended_rows(config: str) -> int:
  name = config.partition(':')[0]
  return ROWS_PER_STEP.get(name) or cli.load_config(config).batch_size


def mesh_flags(config: str, target: str) -> list[str]:
  """For a batch of fewer rows than chips (translation at the paper's
  batch on a pod): a row per data shard and the rest of the chips on
  tensor, where that many divide the heads (at most 8, one host's or a
  TPU's nearest neighbours); else none."""
  rows, chips = intended_rows(config), targets.target(target).chips
  if rows >= chips or chips % rows:
    return []
  tensor = chips // rows
  heads = cli.load_config(config).model.num_heads
  if tensor > 8 or heads % tensor:
    return []
  return [f'--config.mesh.data={rows}', '--config.mesh.fsdp=1',
          f'--config.mesh.tensor={tensor}']


def planned_flags(config: str, target: str, batch: int, budget_s: float,
                  timeout: float) -> list[str] | str:
  """The --config flags of the layout scripts/plan.py finds fastest for
  the pair at ``batch`` rows an update (float32 parameters: the config's
  numerics), or why there is none."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', TPU_SKIP_MDS_QUERY='1')
  try:
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, 'plan.py'), '--target', target,
         '--config', config, f'--global_batch={batch}',
         f'--budget_s={budget_s}', '--param_dtypes=float32', '--output',
         '/dev/stdout'], env=env, capture_output=True, text=True,
        timeout=budget_s + timeout)
  except subprocess.TimeoutExpired:
    return f'no plan within {budget_s + timeout:.0f} s'
  rows = [json.loads(line) for line in out.stdout.splitlines()
          if line.startswith('{')]
  best = next((r for r in rows if r.get('rank') == 1), None)
  if best is None:
    return (failure(out.stderr) if out.stderr.strip() else
            'no layout it compiled fits')
  return ([f'--config.mesh.{k}={best[k]}' for k in ('data', 'fsdp', 'tensor')]
          + [f'--config.model.remat={best["remat"]}',
             f'--config.model.param_dtype={best["param_dtype"]}',
             f'--config.loss_chunk_size={best["loss_chunk_size"]}',
             f'--config.batch_size={best["batch_size"]}',
             f'--config.eval_batch_size={best["batch_size"]}',
             f'--config.optim.grad_accum_steps={best["grad_accum_steps"]}'])


def pair_rows(config: str, target: str, timeout: float,
              largest: bool = True, layout: str = 'shipped',
              plan_budget_s: float = 900,
              train_only: bool = False) -> list[dict]:
  """The pair's row in the layout (with its largest batch unless
  ``largest`` is False; the train step alone with ``train_only``); for a
  GPU host it does not fit, the eight-host target's row too."""
  extra = ['--train_only'] if train_only else []
  batch = table_batch(config, target)
  if layout == 'planner':
    flags_ = planned_flags(config, target, batch, plan_budget_s, timeout)
    if isinstance(flags_, str):
      return [{'config': config, 'target': target, 'layout': layout,
               'error': f'planner: {flags_}'}]
  else:
    flags_ = [f'--config.batch_size={batch}',
              f'--config.eval_batch_size={batch}',
              *mesh_flags(config, target)]
  row = compile_pair(config, target, timeout, *flags_, *extra)
  row.update(layout=layout, layout_flags=[
      f for f in flags_ if not f.startswith(('--config.batch_size',
                                             '--config.eval_batch_size'))])
  if 'error' in row:
    return [row]
  row['largest_batch'] = (largest_batch(row, timeout, *extra) if largest
                          else None)
  hosts = target.replace('-8', '-64')
  if row['fits'] or hosts == target or hosts not in targets.TARGETS:
    return [row]
  if layout != 'shipped':
    return [row]
  return [row] + pair_rows(config, hosts, timeout, largest,
                           train_only=train_only)


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
