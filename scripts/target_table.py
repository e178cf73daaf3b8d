"""The docs' table of configs on TPU pods and GPUs, made by one command.

    python scripts/target_table.py                     # every pair below
    python scripts/target_table.py --configs lm_1_3b --targets v5p-128

Each (config, target) pair is compiled by ``compile_at_size.py --target``
in a process of its own (a GPU target must be the first thing a process
compiles for), with the config as shipped. The rows go to --output as JSON
lines; the table (markdown) to stdout: per-chip memory by the target's
compiler against the chip's, the pre-flight estimate's ratio to it,
compile time, the roofline MFU bound, and the largest global batch that
fits (per-chip memory is affine in the batch: a second compile at half or
twice the batch gives its slope). A GPU pair that does not fit one host is
compiled again for eight hosts (h100-64, h200-64). A pair that fails to compile is a
row saying why. Needs ``pip install -e '.[aot]'`` (and the GPU compiler for
h100/h200 targets, see docs/scaling.md).
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
# The batch each model is compiled at: a million tokens a step for the
# large language models (the scale they are trained at); rounded up to a
# row per chip where the shipped batch is smaller.
TOKENS_PER_STEP = {'lm_1_3b': 1024, 'lm_7b': 512}
GB = 1e9


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
  target_flags.define_output(values)
  argv = sys.argv[1:] if argv is None else list(argv)
  target_flags.parse('target_table.py', argv, values, __doc__, config='never')
  for name in values.targets:
    if name not in targets.TARGETS:
      raise UsageError(f'--targets: unknown {name}; choose from '
                       f'{", ".join(targets.TARGETS)}.')
  for spec in values.configs:
    cli.config_path(spec.partition(':')[0])  # a missing one: one line
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
    lines = out.stderr.strip().splitlines() or ['(no output)']
    # The exception's own line, not JAX's note on filtered frames after it.
    raised = [line for line in lines if re.match(r'\w+(Error|Exception): ',
                                                 line)]
    return {'config': config, 'target': target,
            'error': (raised or lines)[-1]}
  return json.loads(out.stdout.strip().splitlines()[-1])


def largest_batch(row: dict, timeout: float) -> int | None:
  """The largest global batch that fits a chip, a multiple of the batch
  shards, from row's per-chip bytes and a second compile's."""
  shipped = row['batch_size']
  shards = row['mesh']['data'] * row['mesh']['fsdp']
  half = shipped // 2
  other = half if half and half % shards == 0 else 2 * shipped
  second = compile_pair(row['config'], row['target'], timeout,
                        f'--config.batch_size={other}',
                        f'--config.eval_batch_size={other}')
  need, need2 = row['per_chip_bytes'], second.get('per_chip_bytes')
  if not need or not need2:
    return None
  per_row = (need - need2) / (shipped - other)
  if per_row <= 0:  # the compiler laid the other batch out differently
    return None
  fixed = need - per_row * shipped
  rows = (row['chip_memory_bytes'] - fixed) / per_row
  return max(0, int(rows // shards) * shards)


def markdown(rows: list[dict]) -> str:
  """The rows as the docs' table."""
  lines = ['| config | target | mesh | rows x tokens | per chip (compiler) '
           '| fits | largest batch | estimate / compiler | compile '
           '| MFU bound | attention |',
           '|---|---|---|---|---:|---|---:|---:|---:|---:|---|']
  for r in rows:
    if 'error' in r:
      lines.append(f'| `{r["config"]}` | `{r["target"]}` | | | | '
                   f'{r["error"]} | | | | | |')
      continue
    mesh = ' x '.join(f'{k} {v}' for k, v in r['mesh'].items() if v > 1)
    need = r['per_chip_bytes'] or 0
    ratio = f'{r["estimate_bytes"] / need:.2f}x' if need else '-'
    mfu = (f'{r["mfu_bound"]:.0%}' if r.get('mfu_bound') is not None
           else '-')
    fits = 'yes' if r['fits'] else f'no (+{r["over_by_bytes"] / GB:.1f} GB)'
    largest = r.get('largest_batch')
    lines.append(
        f'| `{r["config"]}` | `{r["target"]}` | {mesh or "1"} | '
        f'{r["batch_size"]} x {r["seq_len"]} | {need / GB:.1f} of '
        f'{r["chip_memory_bytes"] / GB:.1f} GB | {fits} | '
        f'{largest if largest is not None else "-"} | {ratio} | '
        f'{r["compile_s"]:.0f} s | {mfu} | {r["attention_kernel"]} |')
  return '\n'.join(lines)


@cli.entry_point('target_table.py')
def main(argv=None) -> int:
  args = parse_args(argv)
  rows = []
  for target in args.targets:
    for config in args.configs:
      for row in pair_rows(config, target, args.timeout):
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
  """The global batch a pair is compiled at (see TOKENS_PER_STEP)."""
  name = config.partition(':')[0]
  shipped = TOKENS_PER_STEP.get(name) or cli.load_config(config).batch_size
  chips = targets.target(target).chips
  return -(-shipped // chips) * chips


def pair_rows(config: str, target: str, timeout: float) -> list[dict]:
  """The pair's row with its largest batch; for a GPU host it does not
  fit, the eight-host target's row too."""
  batch = table_batch(config, target)
  row = compile_pair(config, target, timeout, f'--config.batch_size={batch}',
                     f'--config.eval_batch_size={batch}')
  if 'error' in row:
    return [row]
  row['largest_batch'] = largest_batch(row, timeout)
  hosts = target.replace('-8', '-64')
  if row['fits'] or hosts == target or hosts not in targets.TARGETS:
    return [row]
  return [row] + pair_rows(config, hosts, timeout)


if __name__ == '__main__':
  sys.exit(main())
