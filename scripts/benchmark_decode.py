"""Greedy decoding speed against Hugging Face and PyTorch, interleaved.

    python scripts/benchmark_decode.py            # CPU: minutes
    python scripts/benchmark_decode.py --gpu      # a GPU: under 3 minutes

Default (see ``jax_transformer/bench/decode.py``): a GPT-2-small-shaped LM
(random weights, float32, a 16-token prompt, 64 new tokens) at batch 1 and
8, ``jax_transformer.generate`` (float32, bf16 and int8 weights) against
Hugging Face ``generate`` with its KV cache on the same weights; and the
paper's base encoder-decoder against a greedy loop over the PyTorch
reference module. Every round times each side once, alternating order;
rows give median seconds, tokens/s, ms/token, the speed ratio against the
reference side (median of per-round ratios), the fraction of tokens equal
to the reference's, the bytes a step reads and the fraction of the
bandwidth measured in the same run that this implies.

``--gpu``: bf16 GPT-2 124M at batch 1 and 8, 128 new tokens, ours only,
with the fraction of the device's peak bandwidth (an H200's 4.8 TB/s).

Every row goes to stdout as one JSON object (and to ``--output``); the
table goes to stderr.
"""

from __future__ import annotations

import sys

import jax

from jax_transformer import cli
from jax_transformer.bench import decode, record, timing
from jax_transformer.bench.rows import stream
from jax_transformer.errors import UsageError

OPTIONS = {'jax': {}, 'jax_bf16': {'dtype': 'bfloat16'},
           'jax_int8': {'weights': 'int8'}}


def parse_args(argv=None):
  p = cli.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--gpu', action='store_true',
                 help='the short GPU suite (bf16, ours only)')
  p.add_argument('--batch_sizes', default='1,8')
  p.add_argument('--new_tokens', type=int, default=64)
  p.add_argument('--prompt_len', type=int, default=16)
  p.add_argument('--rounds', type=int, default=5)
  p.add_argument('--options', default=','.join(OPTIONS),
                 help='our sides, of ' + ', '.join(OPTIONS))
  p.add_argument('--no_encoder_decoder', action='store_true')
  p.add_argument('--output', help='also write the JSON lines here')
  p.add_argument('--record', default=str(record.MEASURED),
                 help='the benchmark record this run is appended to')
  p.add_argument('--no_record', action='store_true',
                 help='append no record (a trial run)')
  args = p.parse_args(argv)
  unknown = sorted(set(args.options.split(',')) - set(OPTIONS))
  if unknown:
    p.error(f'--options names {", ".join(unknown)}; choose from '
            f'{", ".join(OPTIONS)}')
  return args


def cases(args):
  batches = [int(b) for b in args.batch_sizes.split(',')]
  if args.gpu:
    for b in batches:
      yield decode.lm_case(b, 128, args.prompt_len,
                           {'jax_bf16': OPTIONS['jax_bf16']},
                           torch_side=False)
    return
  options = {name: OPTIONS[name] for name in args.options.split(',')}
  for b in batches:
    yield decode.lm_case(b, args.new_tokens, args.prompt_len, options)
  if not args.no_encoder_decoder:
    yield decode.encoder_decoder_case(1, args.new_tokens, args.prompt_len)


def table(rows: list[dict]) -> str:
  lines = ['model             side             batch  tok/s   ms/token  '
           'vs ref  same   bandwidth']
  for r in rows:
    ref = next((v for k, v in r.items() if k.startswith('speed_vs_')), None)
    ref = f'{ref:5.2f}x' if ref else '     -'
    same = f"{r['same_tokens']:.2f}" if 'same_tokens' in r else '   -'
    lines.append(f"{r['model']:17} {r['side']:16} {r['batch']:5} "
                 f"{r['tokens_per_s']:7.1f} {r['ms_per_token']:8.2f} "
                 f"{ref}  {same}  {r['bandwidth_fraction']:.2f}")
  return '\n'.join(lines)


@cli.entry_point('benchmark_decode.py')
def main(argv=None) -> int:
  args = parse_args(argv)
  device = jax.devices()[0]
  if args.gpu and device.platform == 'cpu':
    raise UsageError('--gpu needs a GPU or TPU; this machine has only CPUs.')
  load_before = timing.load_average()
  bandwidth = decode.measured_bandwidth()
  peak = decode.peak_bandwidth(device.device_kind)
  rows = stream((dict(row, device=device.device_kind)
                 for case in cases(args)
                 for row in decode.measure(case, args.rounds, bandwidth,
                                           peak)), args.output)
  print(table(rows), file=sys.stderr)
  if not args.no_record:
    record.append(record.make(
        'decode_gpu' if args.gpu else 'decode',
        rows, sys.argv[1:] if argv is None else list(argv), args.rounds,
        load_before, timing.load_average()), args.record)
    print(f'Recorded in {args.record}.', file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
