"""Proof at size on a CPU host: pod-sized train steps compiled, never run.

    python scripts/compile_at_size.py                  # both suites
    python scripts/compile_at_size.py --suite depth --depths 12,48
    python scripts/compile_at_size.py --target v5p-128 --config lm_1_3b

With ``--target NAME`` (``pip install -e '.[aot]'``): the run as
``--config NAME[:preset]`` and any ``--config.a.b=value`` configure it,
compiled by that accelerator's own compiler for its devices (TPU slices,
``--slices N`` of them, or an 8-GPU host), without the hardware; one JSON
row (``jax_transformer/train/target_report.py``): per-chip memory against
the chip's, compile times of the train and eval steps, XLA's cost figures,
collective bytes, the attention kernel, and a roofline bound on step time
and MFU. ``--serialize PATH`` writes the compiled train step. Targets:
``jax_transformer/runtime/targets.py``.

On a mesh of 8 CPU devices (FSDP 4 x tensor 2), the train steps of
``configs/lm_350m.py`` and ``configs/lm_1_3b.py`` are lowered and compiled
ahead of time from abstract state (``jax_transformer/train/aot.py``); nothing is
allocated or run. Suites:

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

import os
import sys

# Before JAX starts: eight host devices stand in for the pod's chips (or
# the target's compiler hands out its own); libtpu must not look for a TPU
# VM's metadata.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
if 'xla_force_host_platform_device_count' not in os.environ.get(
    'XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_force_host_platform_device_count=8')

from absl import flags

from jax_transformer import cli
from jax_transformer.bench.rows import stream
from jax_transformer.errors import UsageError
from jax_transformer.runtime import targets
from jax_transformer.train import aot, memory, target_report

MODELS = {'350m': 'lm_350m', '1.3b': 'lm_1_3b'}
VOCAB = 32768


def parse_args(argv):
  p = cli.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--suite', choices=('size', 'depth', 'all'), default='all')
  p.add_argument('--models', default='350m,1.3b',
                 help='comma-separated, of ' + ', '.join(MODELS))
  p.add_argument('--depths', default='12,48',
                 help='layer counts for the depth suite')
  p.add_argument('--repeats', type=int, default=3,
                 help='depth suite: rounds of the scanned compiles')
  p.add_argument('--batch_size', type=int, default=16,
                 help='global batch of 1024-token rows')
  p.add_argument('--mesh', default='1,4,2', help='data,fsdp,tensor')
  p.add_argument('--output', help='also write the JSON lines here')
  return p.parse_args(argv)


def config(name: str, args, **model):
  cfg = cli.load_config(MODELS[name])
  data, fsdp, tensor = (int(x) for x in args.mesh.split(','))
  cfg.mesh.update(data=data, fsdp=fsdp, tensor=tensor)
  cfg.batch_size = args.batch_size
  cfg.model.update(**model)
  return cfg


def row(suite: str, name: str, cfg, proof: aot.Proof) -> dict:
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
  for name in args.models.split(','):
    variants = [dict(remat=r) for r in ('none', 'dots', 'full')]
    if name == '1.3b':
      variants.append(dict(remat='dots', param_dtype='bfloat16'))
    for changes in variants:
      cfg = config(name, args, **changes)
      yield row('size', name, cfg, aot.prove(cfg, VOCAB))


def depth_suite(args):
  """Scanned compiles take seconds, so host noise matters: they run
  --repeats rounds, interleaved over depths (the table gives medians).
  Unrolled ones take minutes and run once."""
  depths = [int(x) for x in args.depths.split(',')]
  for round_ in range(args.repeats):
    for layers in depths:
      for scan in (True, False) if round_ == 0 else (True,):
        cfg = config('350m', args, num_decoder_layers=layers,
                     scan_layers=scan)
        yield dict(row('depth', '350m', cfg, aot.prove(cfg, VOCAB)),
                   round=round_)


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


def parse_target_args(argv: list[str]):
  """(config, its spec, flag values) of a --target command line."""
  values = flags.FlagValues()
  flags.DEFINE_string('target', None, ', '.join(targets.TARGETS),
                      flag_values=values)
  flags.DEFINE_integer('slices', 1, 'TPU slices', flag_values=values)
  flags.DEFINE_string('serialize', None, 'write the compiled train step here',
                      flag_values=values)
  flags.DEFINE_string('output', None, 'also write the JSON row here',
                      flag_values=values)
  cfg, spec, rest = cli.parse_config_flags(['compile_at_size.py', *argv],
                                           None, values)
  if rest:
    raise UsageError(f'Unexpected arguments {rest}.')
  targets.target(values.target)
  return cfg, spec, values


def target_main(argv: list[str]) -> int:
  cfg, spec, values = parse_target_args(argv)
  row = target_report.report(cfg, spec, values.target, values.slices,
                             values.serialize)
  stream([row], values.output)
  print(target_report.summary(row), file=sys.stderr)
  return 0


@cli.entry_point('compile_at_size.py')
def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if any(a == '--target' or a.startswith('--target=') for a in argv):
    return target_main(argv)
  args = parse_args(argv)
  suites = {'size': [size_suite], 'depth': [depth_suite],
            'all': [size_suite, depth_suite]}[args.suite]
  rows = stream((r for suite in suites for r in suite(args)), args.output)
  print(table(rows), file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
