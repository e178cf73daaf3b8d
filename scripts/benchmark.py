"""Training speed, measured side by side: JSON lines out, a table on the
console.

    python scripts/benchmark.py                       # --suite cpu (minutes)
    python scripts/benchmark.py --suite nanogpt --nanogpt_dir ~/nanoGPT
    python scripts/benchmark.py --suite gpu           # on a GPU or TPU
    python scripts/benchmark.py --suite pipeline
    python scripts/benchmark.py --suite stop          # SIGTERM to exit
    python scripts/benchmark.py --suite restart       # back to the first step
    python scripts/benchmark.py --suite restart --restart_shapes lm_350m
    python scripts/benchmark.py --suite local_tier    # the local tier's cost
    python scripts/benchmark.py --suite plan          # the planner's model
    python scripts/benchmark.py --suite lora --rounds 3  # LoRA vs full
    python scripts/benchmark.py --suite harness --limit 200  # lm-eval
    python scripts/benchmark.py --suite serve         # the HTTP server
    python scripts/benchmark.py --suite sequence      # the sequence axis
    python scripts/benchmark.py --suite matmul        # the forward's dots

Suites (see ``jax_transformer/bench/``):

* ``cpu``: our jitted train step and eval forward against PyTorch's
  reference module on the same weights and shapes (the paper's base model,
  batch 8 x 64 + 64 tokens; the default LM's size against Hugging Face
  GPT-2), interleaved rounds, median times and the median of per-round
  ratios (below 1: we are faster), compile time, the fraction of the
  machine's float32 matmul rate each side reaches, the load average;
* ``nanogpt``: the default job against nanoGPT (a clone, run as a
  subprocess) on the same bytes, size, batch, schedule and steps: wall
  time, and validation loss at equal steps and at equal wall time, a row
  per round (default 5; the rounds alternate which side runs first);
* ``gpu``: bf16 throughput, MFU and peak memory of a 124M and a 350M
  decoder LM and the base encoder-decoder, each item time-boxed;
* ``pipeline``: the input pipeline's sustained supply (token stores of
  WMT14 and lm1b shape, in process and with worker processes) against what
  the base model and gpt2_small consume on one H200 and one TPU v5p chip
  at 40% MFU: a row per model and chip;
* ``stop``: seconds from SIGTERM to the exit of ``train.py`` on each
  shipped config (``--stop_configs``), mid-training;
* ``restart``: seconds from process start to the first finished step of
  the default job and of lm_350m's model on 8 CPU host devices
  (``--restart_shapes``), each as two processes: a cold start (empty
  compilation cache), a warm start (the cache filled) and a restart after
  SIGKILL of one process (from the local checkpoint tier), each split into start-up,
  restore, data iterator and compile (cache hit or miss), and the ratios
  restart / warm start (goal: <= 1.5) and restart compile / cold compile
  (goal: < 0.1);
* ``local_tier``: the default job's seconds per training step (steps,
  data waits and checkpoints; start-up, compile and evaluation left out)
  without and with the local checkpoint tier (``--local_every``, in
  /dev/shm), one ``train.py`` process of ``--steps`` (default 200) each,
  interleaved ``--rounds`` (default 2): per round, the medians, the median
  ratio with / without and the overhead in percent (goal: under 3%);
* ``lora``: a LoRA train step against a full fine-tuning step of the same
  model (``finetune:gpt2_shakespeare``'s shape, rank 8), interleaved
  rounds: the median per-round ratio lora / full (goal: <= 0.75) and each
  compiled step's memory per device;
* ``plan``: the planner's predicted time an update against measured steps
  on the devices at hand: its top three layouts of ``--plan_config``
  (default gpt2_small) on a GPU or TPU, eight layouts of a small LM on CPU
  host devices; Spearman's rank correlation and whether the predicted
  fastest is the measured fastest;
* ``harness``: the lm-eval backend against lm-eval's own Hugging Face
  backend on a GPT-2-small-shaped checkpoint made here and the bundled
  tasks (``--limit`` documents each, default 200, the same
  ``--batch_size``), interleaved rounds (default 3): median wall times and
  the median per-round ratio (goal: at most 0.5);
* ``serve``: ``scripts/serve.py`` against ``transformers serve
  --continuous-batching`` on a GPT-2-small-shaped checkpoint made here, 1, 8
  and 32 concurrent streaming clients (``--clients``) sending a fixed mix
  of prompt and answer lengths, interleaved rounds (default 2): output
  tokens per second, time to first token (p50, p99) and per output token;
  goals: at 32 clients at least 2x transformers' throughput with a lower
  p50 time to first token, at 1 client 90% of the fp32 weight-streaming
  rate.
* ``sequence``: a train step of two rows of a small LM on 8 CPU host
  devices, rows split over the sequence axis (fsdp 2 x sequence 4)
  against heads split over tensor (fsdp 2 x tensor 4), at seq_len 512 to
  4096 (``--seq_lens``), interleaved rounds (default 5): median times, the
  median per-round ratio sequence / tensor, each step's memory a device.
* ``matmul``: the paper-base forward's matrix products alone (the ``cpu``
  suite's batch), XLA:CPU's float32 dot against PyTorch's at each shape,
  interleaved rounds (default 7): median times and GFLOP/s, the median
  per-round ratio, and the ratio of all of one forward's dots together.

Every row goes to stdout as one JSON object (and to ``--output``); the
table goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from jax_transformer import cli
from jax_transformer.bench import timing
from jax_transformer.errors import UsageError

SUITES = ('cpu', 'nanogpt', 'gpu', 'pipeline', 'stop', 'plan', 'lora',
          'restart', 'local_tier', 'harness', 'serve', 'sequence', 'matmul')


def gpu_items() -> tuple[str, ...]:
  from jax_transformer.bench import gpu  # pylint: disable=g-import-not-at-top
  return tuple(gpu.ITEMS)


def _positive_ints(p: argparse.ArgumentParser, flag: str,
                   text: str) -> tuple[int, ...]:
  """--flag's comma-separated positive integers (p.error otherwise)."""
  try:
    values = tuple(int(v) for v in text.split(','))
  except ValueError:
    values = (0,)
  if min(values) < 1:
    p.error(f'--{flag} must be positive integers separated by commas, got '
            f'{text!r}.')
  return values


def parse_args(argv=None) -> argparse.Namespace:
  p = cli.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--suite', default='cpu', choices=SUITES)
  p.add_argument('--rounds', type=int, default=None,
                 help='interleaved rounds per comparison (default 7; '
                 'local_tier, serve, harness, sequence, nanogpt, plan and '
                 'pipeline: 5)')
  p.add_argument('--models', default='transformer_base,default_lm',
                 help='cpu: comma-separated, of transformer_base,default_lm,'
                 'transformer_base_scan (layers under lax.scan)')
  p.add_argument('--nanogpt_dir', help='nanogpt: a clone of '
                 'https://github.com/karpathy/nanoGPT')
  p.add_argument('--steps', type=int, default=None,
                 help='nanogpt, local_tier: training steps of each side '
                 '(default 600; local_tier: 200)')
  p.add_argument('--local_every', type=int, default=10,
                 help='local_tier: steps between local saves (a divisor of '
                 '--steps)')
  p.add_argument('--gpu_items', default=','.join(gpu_items()),
                 help='gpu: comma-separated items')
  p.add_argument('--seconds_per_item', type=float, default=42,
                 help='gpu: time limit of each item, compile included '
                 '(the seven default items fit in 5 minutes)')
  p.add_argument('--stop_configs', default=None,
                 help='stop: comma-separated configs (default: every '
                 'shipped one)')
  p.add_argument('--plan_config', default=None,
                 help='plan: the config planned on a GPU or TPU')
  p.add_argument('--plan_sizes', default='tiny,small,gpt2_small_4l',
                 help='plan, on CPU: comma-separated, of tiny,small,'
                 'gpt2_small_4l (the models whose layouts are measured)')
  p.add_argument('--restart_shapes', default='default,lm_350m',
                 help='restart: comma-separated, of default (the default '
                 'job) and lm_350m (lm_350m\'s model on 8 CPU host devices)')
  p.add_argument('--limit', type=int, default=200,
                 help='harness: documents per task')
  p.add_argument('--batch_size', type=int, default=16,
                 help='harness: rows per batch, both sides')
  p.add_argument('--clients', default='1,8,32',
                 help='serve: numbers of concurrent clients, comma-separated')
  p.add_argument('--seq_lens', default='512,1024,2048,4096',
                 help='sequence: comma-separated row lengths')
  p.add_argument('--output', help='also append the JSON lines here')
  p.add_argument('--record', default=None,
                 help='the benchmark record this run is appended to '
                 '(docs/records/measured.jsonl: the docs\' tables are made '
                 'from it by scripts/report.py)')
  p.add_argument('--no_record', action='store_true',
                 help='append no record (a trial run)')
  args = p.parse_args(argv)
  if args.suite == 'nanogpt' and not args.nanogpt_dir:
    p.error('--suite nanogpt needs --nanogpt_dir (a clone of '
            'https://github.com/karpathy/nanoGPT).')
  if args.stop_configs:
    from jax_transformer.bench import stop  # pylint: disable=g-import-not-at-top
    known = [name for name, _ in stop.CONFIGS]
    unknown = sorted(set(args.stop_configs.split(',')) - set(known))
    if unknown:
      p.error(f'--stop_configs: unknown {", ".join(unknown)}; choose from '
              f'{", ".join(known)}.')
  from jax_transformer.bench.step import CASES  # pylint: disable=g-import-not-at-top
  from jax_transformer.plan.measure import HOST_SIZES  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(args.models.split(',')) - set(CASES))
  if unknown:
    p.error(f'--models: unknown {", ".join(unknown)}; choose from '
            f'{", ".join(CASES)}.')
  unknown = sorted(set(args.plan_sizes.split(',')) - set(HOST_SIZES))
  if unknown:
    p.error(f'--plan_sizes: unknown {", ".join(unknown)}; choose from '
            f'{", ".join(HOST_SIZES)}.')
  from jax_transformer.bench.restart import SHAPES  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(args.restart_shapes.split(',')) - set(SHAPES))
  if unknown:
    p.error(f'--restart_shapes: unknown {", ".join(unknown)}; choose from '
            f'{", ".join(SHAPES)}.')
  local = args.suite == 'local_tier'
  if args.rounds is None:
    args.rounds = (5 if local or args.suite in (
        'serve', 'harness', 'sequence', 'nanogpt', 'plan', 'pipeline')
                   else 7)
  if args.steps is None:
    args.steps = 200 if local else 600
  if min(args.rounds, args.steps, args.local_every, args.limit,
         args.batch_size) < 1:
    p.error('--rounds, --steps, --local_every, --limit and --batch_size '
            'must be positive.')
  args.clients = _positive_ints(p, 'clients', args.clients)
  args.seq_lens = _positive_ints(p, 'seq_lens', args.seq_lens)
  if local and args.steps % args.local_every:
    p.error(f'--local_every={args.local_every} does not divide '
            f'--steps={args.steps} (the workdir saves only at the last '
            'step, and the local tier\'s interval must divide it).')
  return args


def run_suite(args: argparse.Namespace) -> list[dict]:
  if args.suite == 'cpu':
    from jax_transformer.bench import step  # pylint: disable=g-import-not-at-top
    return step.run(args.rounds, tuple(args.models.split(',')))
  if args.suite == 'nanogpt':
    from jax_transformer.bench import nanogpt  # pylint: disable=g-import-not-at-top
    return nanogpt.run(args.nanogpt_dir, args.steps, args.rounds)
  if args.suite == 'gpu':
    import jax  # pylint: disable=g-import-not-at-top
    if jax.default_backend() == 'cpu':
      raise UsageError('--suite gpu needs a GPU or TPU; this machine has '
                       'only CPUs.')
    from jax_transformer.bench import gpu  # pylint: disable=g-import-not-at-top
    return gpu.run(tuple(args.gpu_items.split(',')),
                   seconds_per_item=args.seconds_per_item)
  if args.suite == 'plan':
    # Before JAX's backend starts: eight CPU host devices where there is
    # no accelerator (ignored where there is one).
    if 'device_count' not in os.environ.get('XLA_FLAGS', ''):
      os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                                 ' --xla_force_host_platform_device_count=8')
    from jax_transformer.bench import plan  # pylint: disable=g-import-not-at-top
    return plan.run(args.plan_config, rounds=args.rounds,
                    sizes=tuple(args.plan_sizes.split(',')))
  if args.suite == 'sequence':
    if 'device_count' not in os.environ.get('XLA_FLAGS', ''):
      os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                                 ' --xla_force_host_platform_device_count=8')
    from jax_transformer.bench import sequence  # pylint: disable=g-import-not-at-top
    return sequence.run(args.rounds, args.seq_lens)
  if args.suite == 'matmul':
    from jax_transformer.bench import matmul  # pylint: disable=g-import-not-at-top
    return matmul.run(args.rounds)
  if args.suite == 'lora':
    from jax_transformer.bench import lora  # pylint: disable=g-import-not-at-top
    return lora.run(args.rounds)
  if args.suite == 'restart':
    from jax_transformer.bench import restart  # pylint: disable=g-import-not-at-top
    return list(restart.run(tuple(args.restart_shapes.split(','))))
  if args.suite == 'local_tier':
    from jax_transformer.bench import local_tier  # pylint: disable=g-import-not-at-top
    return list(local_tier.run(args.steps, args.rounds, args.local_every))
  if args.suite == 'harness':
    from jax_transformer.bench import harness  # pylint: disable=g-import-not-at-top
    return harness.run(args.rounds, args.limit, args.batch_size)
  if args.suite == 'serve':
    from jax_transformer.bench import serve  # pylint: disable=g-import-not-at-top
    return serve.run(args.rounds, args.clients)
  if args.suite == 'stop':
    from jax_transformer.bench import stop  # pylint: disable=g-import-not-at-top
    configs = args.stop_configs and tuple(args.stop_configs.split(','))
    return list(stop.run(configs))
  from jax_transformer.bench import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline.run(rounds=args.rounds)


TABLE_KEYS = ('model', 'step', 'jax_s', 'torch_s', 'ratio', 'compile_s',
              'jax_floor_fraction', 'torch_floor_fraction', 'ours_wall_s',
              'nanogpt_wall_s', 'wall_ratio', 'ours_val_loss',
              'nanogpt_val_loss', 'ours_val_loss_at_nanogpt_end',
              'step_s', 'tokens_per_s', 'mfu', 'mfu_vs_matmul',
              'peak_memory_gb', 'device', 'supply_tokens_per_s',
              'demand_tokens_per_s', 'worker_count', 'cores_needed',
              'config', 'signal_to_exit_s', 'exit_status', 'saved_step',
              'compiled_to_signal_s', 'layout', 'predicted_step_s',
              'measured_step_s', 'predicted_mfu', 'measured_over_predicted',
              'spearman', 'top_choice_agrees', 'lora_s', 'full_s',
              'lora_memory_gb', 'full_memory_gb', 'shape', 'start', 'first_step',
              'to_first_step_s', 'startup_s', 'restore_s', 'data_iterator_s',
              'cache', 'xla_s', 'other_processes_s', 'steps_lost',
              'restart_over_warm', 'restart_compile_over_cold',
              'restart_xla_over_cold', 'side', 'round', 'steps',
              'checkpoint_s', 'local_saves', 'without_s', 'with_s',
              'overhead_percent', 'ours_wall_s', 'hf_wall_s',
              'ratio_min', 'ratio_max', 'ours_first_round_s',
              'hf_first_round_s', 'load_average_before',
              'load_average_after', 'clients', 'throughput_ratio',
              'ours_tokens_per_s', 'hf_tokens_per_s', 'ours_ttft_p50_s',
              'hf_ttft_p50_s', 'ours_ttft_p99_s', 'hf_ttft_p99_s',
              'ours_tpot_s', 'hf_tpot_s', 'ours_weight_streaming',
              'load_average', 'sequence_s', 'tensor_s',
              'sequence_memory_gb', 'tensor_memory_gb', 'what',
              'jax_gflop_s', 'torch_gflop_s', 'error')


def table(rows: list[dict]) -> str:
  """The rows' headline fields, one line each."""
  def fmt(v):
    return f'{v:.3g}' if isinstance(v, float) else str(v)
  lines = []
  for row in rows:
    lines.append('  '.join(f'{k}={fmt(row[k])}' for k in TABLE_KEYS
                           if row.get(k) is not None))
  return '\n'.join(lines)


@cli.entry_point('benchmark.py')
def main(argv=None) -> int:
  args = parse_args(argv)
  from jax_transformer.runtime import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.retain_freed_memory()  # as train.py does
  load_before = timing.load_average()
  rows = run_suite(args)
  for row in rows:
    line = json.dumps(row)
    print(line, flush=True)
    if args.output:
      with open(args.output, 'a') as f:
        f.write(line + '\n')
  print(table(rows), file=sys.stderr)
  if not args.no_record:
    from jax_transformer.bench import record  # pylint: disable=g-import-not-at-top
    args.record = args.record or str(record.MEASURED)
    record.append(record.make(
        args.suite, rows, sys.argv[1:] if argv is None else list(argv),
        args.rounds, load_before, timing.load_average()), args.record)
    print(f'Recorded in {args.record}.', file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
