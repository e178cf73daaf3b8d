"""Proof at size on a CPU host: pod-sized train steps compiled, never run.

    python scripts/compile_at_size.py                  # both suites
    python scripts/compile_at_size.py --suite depth --depths 12,48
    python scripts/compile_at_size.py --target v5p-128 --config lm_1_3b

With ``--target NAME`` (``pip install -e '.[aot]'``): the run as
``--config NAME[:preset]`` and any ``--config.a.b=value`` configure it,
compiled by that accelerator's own compiler for its devices (TPU slices,
``--slices N`` of them, or an 8-GPU host), without the hardware; one JSON
row (``jax_transformer/compile/report.py``): per-chip memory against
the chip's, compile times of the train and eval steps, XLA's cost figures,
collective bytes, the attention kernel, and the predicted step time and
MFU (the planner's step-time model, ``compile/step_model.py``; the
network between hosts or slices at ``--network_gbps`` a chip, or the
chip's default).
``--serialize PATH`` writes the compiled train step; ``--record`` appends
the row to ``docs/records/predicted.jsonl``, from which
``scripts/report.py`` makes README's table of predictions. Targets:
``jax_transformer/runtime/targets.py``.

On a mesh of 8 CPU devices (FSDP 4 x tensor 2), the train steps of
``configs/lm_350m.py`` and ``configs/lm_1_3b.py`` are lowered and compiled
ahead of time from abstract state (``jax_transformer/compile/prove.py``);
nothing is allocated or run. Suites:

* ``size``: per-device memory (the pre-flight estimate and XLA's figure)
  and compile time of each model with remat 'none', 'dots' and 'full', and
  of the 1.3B model with bfloat16 parameters and optimizer state;
* ``depth``: compile time of the 350M model's width at each of --depths
  layers, scanned and unrolled (goal: scanned, independent of depth to
  within 20% from 12 to 48 layers).

Every row goes to stdout as one JSON object (and to ``--output``); the
table goes to stderr. Compile times depend on the host: compare rows of
one run.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from absl import flags

from jax_transformer import cli
from jax_transformer.bench.rows import stream
from jax_transformer.compile import flags as target_flags
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment, doors
from jax_transformer.runtime import targets

if TYPE_CHECKING:
  from jax_transformer.compile import prove

# JAX starts in main, as train.py --aot_target starts it (targets.start:
# eight host devices stand in for the pod's chips, or the target's
# compiler hands out its own); the modules that import it are imported
# where used.
HOST_DEVICES = 8
MODELS = {'350m': 'lm_350m', '1.3b': 'lm_1_3b'}
VOCAB = 32768
# The flags of the CPU suites (without --target).
SUITE_FLAGS = ('suite', 'models', 'depths', 'repeats', 'batch_size', 'mesh')


def parse_args(argv):
  """(config, its spec, flag values): the config and spec None without
  --target (the CPU suites)."""
  values = flags.FlagValues()
  flags.DEFINE_enum('suite', 'all', ['size', 'depth', 'all'],
                    'Without --target: the CPU suites to run.',
                    flag_values=values)
  flags.DEFINE_string('models', '350m,1.3b',
                      'comma-separated, of ' + ', '.join(MODELS),
                      flag_values=values)
  flags.DEFINE_string('depths', '12,48', 'layer counts for the depth suite',
                      flag_values=values)
  flags.DEFINE_integer('repeats', 3,
                       'depth suite: rounds of the scanned compiles',
                       flag_values=values)
  flags.DEFINE_integer('batch_size', 16, 'global batch of 1024-token rows',
                       flag_values=values)
  flags.DEFINE_string('mesh', '1,4,2', 'data,fsdp,tensor', flag_values=values)
  target_flags.define_target(values)
  target_flags.define_serialize(values)
  flags.DEFINE_bool('train_only', False, 'With --target: compile the train '
                    'step alone (not the eval step and the decode).',
                    flag_values=values)
  target_flags.define_overlap(values)
  target_flags.define_network(values)
  target_flags.define_output(values, 'the JSON lines')
  flags.DEFINE_bool('record', False, 'With --target: append the row to the '
                    'record of predictions (docs/records/predicted.jsonl), '
                    "from which scripts/report.py makes README's predicted "
                    'table.', flag_values=values)
  cfg, spec = target_flags.parse('compile_at_size.py', argv, values,
                                 __doc__, config='optional')
  if values.target is None:
    if cfg is not None:
      raise UsageError('--config configures a compile for a target; give '
                       '--target NAME too (without it the CPU suites run '
                       'their own configs).')
    if values.serialize:
      raise UsageError('--serialize writes a --target compile; give '
                       '--target NAME too.')
    if values.slices != 1:
      raise UsageError('--slices needs --target NAME.')
    if values.train_only:
      raise UsageError('--train_only narrows a --target compile; give '
                       '--target NAME too.')
    if values.record:
      raise UsageError('--record keeps a --target compile\'s predictions; '
                       'give --target NAME too.')
    if values.network_gbps is not None:
      raise UsageError('--network_gbps prices a --target compile; give '
                       '--target NAME too.')
    return None, None, values
  given = [f'--{name}' for name in SUITE_FLAGS if values[name].present]
  if given:
    raise UsageError(f'{", ".join(given)}: a flag of the CPU suites; with '
                     '--target, configure the run with --config.a.b=value.')
  if cfg is None:
    raise UsageError('--target needs --config NAME[:preset]; give a config '
                     'such as lm_1_3b.')
  targets.network_rate(targets.target(values.target), values.network_gbps)
  return cfg, spec, values


def config(name: str, args, **model) -> Experiment:
  try:
    data, fsdp, tensor = (int(x) for x in args.mesh.split(','))
  except ValueError:
    raise UsageError(f'--mesh {args.mesh}: give data,fsdp,tensor, e.g. '
                     '1,4,2.') from None
  return doors.load(MODELS[name]).replace(
      **{'mesh.data': data, 'mesh.fsdp': fsdp, 'mesh.tensor': tensor,
         'batch_size': args.batch_size},
      **{f'model.{k}': v for k, v in model.items()})


def row(suite: str, name: str, cfg, proof: prove.Proof) -> dict:
  m = cfg.model
  out = {'suite': suite, 'model': name, 'layers': m.num_decoder_layers,
         'scan_layers': m.scan_layers, 'remat': m.remat,
         'param_dtype': m.param_dtype, 'params': proof.num_params,
         'compile_s': round(proof.compile_s, 2),
         'hlo_instructions': proof.instructions,
         'estimate_bytes': proof.estimate.total}
  if proof.xla is not None:
    out['xla_bytes'] = proof.xla.total
    out['xla_temporaries'] = proof.xla.temporaries
  return out


def size_suite(args):
  from jax_transformer.compile import lowering, prove  # pylint: disable=g-import-not-at-top
  for name in args.models.split(','):
    variants = [dict(remat=r) for r in ('none', 'dots', 'full')]
    if name == '1.3b':
      variants.append(dict(remat='dots', param_dtype='bfloat16'))
    for changes in variants:
      cfg = config(name, args, **changes)
      proof = prove.prove(lowering.lower_here(cfg, VOCAB))
      yield row('size', name, cfg, proof)


def depth_suite(args):
  """Scanned compiles take seconds, so host noise matters: they run
  --repeats rounds, interleaved over depths (the table gives medians).
  Unrolled ones take minutes and run once."""
  from jax_transformer.compile import lowering, prove  # pylint: disable=g-import-not-at-top
  depths = [int(x) for x in args.depths.split(',')]
  for round_ in range(args.repeats):
    for layers in depths:
      for scan in (True, False) if round_ == 0 else (True,):
        cfg = config('350m', args, num_decoder_layers=layers,
                     scan_layers=scan)
        proof = prove.prove(lowering.lower_here(cfg, VOCAB))
        yield dict(row('depth', '350m', cfg, proof), round=round_)


def medians(rows: list[dict]) -> list[dict]:
  """One row per configuration, its compile time the median of its
  rounds."""
  groups = {}
  for r in rows:
    key = (r['suite'], r['model'], r['layers'], r['scan_layers'], r['remat'],
           r['param_dtype'])
    groups.setdefault(key, []).append(r)
  out = []
  for group in groups.values():
    times = sorted(r['compile_s'] for r in group)
    out.append(dict(group[0], compile_s=times[len(times) // 2],
                    rounds=len(times)))
  return out


def table(rows: list[dict]) -> str:
  from jax_transformer.train import memory  # pylint: disable=g-import-not-at-top
  lines = ['suite  model  layers  scan   remat  params   compile   '
           'estimate   XLA/device']
  for r in medians(rows):
    dtype = ' bf16' if r['param_dtype'] == 'bfloat16' else ''
    xla = memory.readable(r['xla_bytes']) if 'xla_bytes' in r else '-'
    lines.append(
        f"{r['suite']:6} {r['model']:6} {r['layers']:6}  "
        f"{str(r['scan_layers']):6} {r['remat']:5}{dtype:5} "
        f"{r['params'] / 1e6:6.0f}M {r['compile_s']:7.1f} s "
        f"{memory.readable(r['estimate_bytes']):>10} {xla:>10}")
  return '\n'.join(lines)


def target_main(cfg, spec: str, values, argv: list[str]) -> int:
  from jax_transformer.bench import record  # pylint: disable=g-import-not-at-top
  from jax_transformer.compile import report  # pylint: disable=g-import-not-at-top
  target = targets.target(values.target)
  row = report.report(cfg, spec, values.target, values.slices,
                      values.serialize, values.train_only,
                      targets.network_rate(target, values.network_gbps))
  stream([row], values.output)
  if values.record:
    record.append(record.predicted(row, argv), record.PREDICTED)
  print(report.summary(row), file=sys.stderr)
  return 0


@cli.entry_point('compile_at_size.py')
def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  cfg, spec, args = parse_args(argv)
  with targets.start(args.target, host_devices=HOST_DEVICES,
                     overlap=args.xla_overlap):
    import jax  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  if args.target is not None:
    return target_main(cfg, spec, args, argv)
  suites = {'size': [size_suite], 'depth': [depth_suite],
            'all': [size_suite, depth_suite]}[args.suite]
  rows = stream((r for suite in suites for r in suite(args)), args.output)
  print(table(rows), file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
