"""The fastest layout of a run that fits a TPU slice or GPU hosts, found by
their compiler from this host.

    python scripts/plan.py --config lm_1_3b --target v5p-128 \\
        --tokens_per_step 1048576
    python scripts/plan.py --config lm_7b --target v5e-256 --output plan.jsonl

Enumerates mesh splits (data x fsdp x tensor), remat policies, parameter
dtypes, loss chunk sizes and per-step rows with gradient accumulation that
make the global batch; prunes those the pre-flight memory estimate rules
out; compiles the rest, the config's own layout first and then by a
guessed time, with the target's compiler while --budget_s lasts (results
are cached by the lowered step's fingerprint); ranks those that fit by a
step-time model of each executable (``jax_transformer/plan/``,
``jax_transformer/compile/step_model.py``). Prints
the table and the winner as ``train.py`` flags; --output gets one JSON
row per candidate. Needs ``pip install -e '.[aot]'`` (and the GPU
compiler for h100/h200 targets, see docs/scaling.md).
"""

from __future__ import annotations

import json
import shlex
import sys

from absl import flags

from jax_transformer import cli
from jax_transformer.compile import flags as target_flags
from jax_transformer.compile import step_model
from jax_transformer.errors import UsageError
from jax_transformer.plan import candidates as cands
from jax_transformer.plan import search
from jax_transformer.runtime import targets
from jax_transformer.train import memory

SHOWN = 12


def parse_args(argv: list[str]):
  """(config, spec, the --config.* overrides given, flag values)."""
  values = flags.FlagValues()
  target_flags.define_target(values, help_='Plan for ' +
                             target_flags.TARGETS_HELP + ' (required).')
  flags.DEFINE_integer('global_batch', None, 'rows per optimizer update',
                       flag_values=values)
  flags.DEFINE_integer('tokens_per_step', None,
                       'tokens per optimizer update (rows x seq_len)',
                       flag_values=values)
  flags.DEFINE_float('budget_s', 600, 'seconds the plan may take',
                     flag_values=values)
  target_flags.define_output(values, 'one JSON row per candidate')
  target_flags.define_network(values)
  flags.DEFINE_list('param_dtypes', list(cands.PARAM_DTYPES),
                    'parameter dtypes to consider (bfloat16 parameters and '
                    "Adam moments change the training's numerics)",
                    flag_values=values)
  flags.DEFINE_list('remats', list(cands.REMATS),
                    'remat policies to consider (model.remat)',
                    flag_values=values)
  flags.DEFINE_string('cache_dir', search.DEFAULT_CACHE,
                      'compiled candidates kept here ("" for none)',
                      flag_values=values)
  cfg, spec = target_flags.parse('plan.py', argv, values, __doc__)
  if values.target is None:
    raise UsageError('--target is required; choose one of '
                     f'{", ".join(targets.TARGETS)}.')
  target = targets.target(values.target)
  targets.check_slices(target, values.slices)
  targets.network_rate(target, values.network_gbps)
  unknown = set(values.param_dtypes) - set(cands.PARAM_DTYPES)
  if unknown or not values.param_dtypes:
    raise UsageError(f'--param_dtypes takes '
                     f'{" and ".join(cands.PARAM_DTYPES)}, got '
                     f'{",".join(values.param_dtypes)}.')
  unknown = set(values.remats) - set(cands.REMATS)
  if unknown or not values.remats:
    raise UsageError(f'--remats takes {", ".join(cands.REMATS)}, got '
                     f'{",".join(values.remats)}.')
  overrides = [a for a in argv if a.startswith('--config.')]
  return cfg, spec, overrides, values


def global_batch(cfg, values) -> int:
  """Rows per update: --global_batch, --tokens_per_step / seq_len, or the
  config's batch_size x grad_accum_steps."""
  if values.global_batch is not None and values.tokens_per_step is not None:
    raise UsageError('Give --global_batch or --tokens_per_step, not both.')
  if values.tokens_per_step is not None:
    if values.tokens_per_step < cfg.seq_len:
      raise UsageError(f'--tokens_per_step {values.tokens_per_step} is '
                       f'less than one row of seq_len {cfg.seq_len}.')
    return values.tokens_per_step // cfg.seq_len
  rows = values.global_batch or (
      cfg.batch_size * cfg.optim.grad_accum_steps)
  if rows < 1:
    raise UsageError(f'--global_batch must be 1 or more, got {rows}.')
  return rows


def table(rows: list[dict]) -> str:
  """The best SHOWN rows, the config's own layout among them."""
  shown = [r for r in rows if r['rank'] and r['rank'] <= SHOWN]
  shown += [r for r in rows if r['shipped'] and r not in shown]
  lines = [f'Predicted by the step model (cost version '
           f'{step_model.COST_VERSION}), not measured; ties (within 0.5%) '
           'go to float32 parameters, then to the fewest bytes moved.',
           'rank  layout' + ' ' * 58 + 'per chip     fits  ms/update  '
           'pred. MFU  GB moved  links  compile']
  for r in shown:
    need = memory.readable(r['per_chip_bytes']) if r['per_chip_bytes'] \
        else '-'
    ms = (search.milliseconds(r['predicted_step_s']).removesuffix(' ms')
          if r['predicted_step_s'] else '-')
    mfu = f'{r["predicted_mfu"]:9.0%}' if r['predicted_mfu'] else '        -'
    moved = (f'{search.bytes_moved(r) / 1e9:8.1f}' if r.get('cost_bytes')
             else '       -')
    share = f'{r["link_share"]:5.0%}' if r.get('link_share') is not None \
        else '    -'
    mark = ' (shipped)' if r['shipped'] else ''
    lines.append(f'{r["rank"] or "-":>4}  {(r["layout"] + mark):64.64} '
                 f'{need:>10}  {"yes" if r["fits"] else "no ":>4} {ms:>9}  '
                 f'{mfu}  {moved}  {share}  {r["compile_s"] or 0:5.0f} s')
  counts = {}
  for r in rows:
    counts[r['status']] = counts.get(r['status'], 0) + 1
  lines.append('candidates: ' + ', '.join(f'{n} {k}' for k, n in
                                          sorted(counts.items())))
  return '\n'.join(lines)


def winner_command(rows: list[dict], spec: str, overrides: list[str]
                   ) -> str | None:
  best = next((r for r in rows if r['rank'] == 1), None)
  if best is None:
    return None
  fields = ('data', 'fsdp', 'tensor')
  flags_ = [f'--config.mesh.{k}={best[k]}' for k in fields] + [
      f'--config.model.remat={best["remat"]}',
      f'--config.model.param_dtype={best["param_dtype"]}',
      f'--config.loss_chunk_size={best["loss_chunk_size"]}',
      f'--config.batch_size={best["batch_size"]}',
      f'--config.eval_batch_size={best["batch_size"]}',
      f'--config.optim.grad_accum_steps={best["grad_accum_steps"]}']
  keep = [o for o in overrides
          if o.split('=')[0] not in {f.split('=')[0] for f in flags_}]
  return shlex.join(['python', 'train.py', '--config', spec, *keep, *flags_])


@cli.entry_point('plan.py')
def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  cfg, spec, overrides, values = parse_args(argv)
  rows_per_update = global_batch(cfg, values)
  # As train.py --aot_target and compile_at_size.py start (this module's
  # imports imported JAX; no backend has started).
  with targets.start(values.target):
    pass
  where = search.Where.target(values.target, values.slices,
                             values.network_gbps)
  rows = search.plan(cfg, spec, where, rows_per_update, values.budget_s,
                     values.cache_dir or None,
                     param_dtypes=tuple(values.param_dtypes),
                     remats=tuple(values.remats))
  if values.output:
    with open(values.output, 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in rows)
  print(table(rows))
  command = winner_command(rows, spec, overrides)
  if command is None:
    print(f'No layout of {spec} fits {values.target} at {rows_per_update} '
          f'rows an update among those compiled; {memory.ADVICE}.')
    return 1
  best = rows[0]
  own = next(r for r in rows if r['shipped'])
  print(f'\nFastest that fits, by the step model: {best["layout"]}, '
        f'{search.milliseconds(best["predicted_step_s"])} an update, '
        f'predicted MFU {best["predicted_mfu"]:.0%} (the config\'s own '
        f'layout: {_own(own)}); ranked by {best["ranked_by"]}.\n{command}')
  return 0


def _own(row: dict) -> str:
  if row['predicted_step_s']:
    return (f'{search.milliseconds(row["predicted_step_s"])}, predicted '
            f'MFU {row["predicted_mfu"]:.0%}')
  return 'does not fit' if row['fits'] is False else row['status']


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
