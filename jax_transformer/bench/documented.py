"""The measured figures the docs show, each tied to the benchmark record.

A :class:`Figure` names the suite whose record holds it, the rows it is
read from (``where``) and their field, how the table writes it, the
command that measures it, and the files whose change makes a record of
it stale (``measures``). ``scripts/report.py`` writes README's and
docs/performance.md's tables of measured figures from the newest record
of each; a figure no record holds is not written, and one whose
``measures`` changed after its record's commit is written marked stale
(``tests/bench/test_records.py`` keeps the docs equal to what the record
makes).
"""

from __future__ import annotations

import dataclasses
import subprocess
from typing import Any

from jax_transformer.bench import record
from jax_transformer.compile import step_model
from jax_transformer.plan import measure

# What a model's step is made of: a change here changes what a step
# benchmark measured.
STEP_CODE = ('jax_transformer/model/', 'jax_transformer/train/steps.py',
             'jax_transformer/train/losses.py', 'jax_transformer/train/optim.py',
             'jax_transformer/runtime/xla_options.py')
# The row lengths of the sequence suite's documented figures (its default
# --seq_lens, jax_transformer/bench/sequence.py).
SEQUENCE_LENGTHS = (512, 1024, 2048, 4096)
DECODE_CODE = ('jax_transformer/model/', 'jax_transformer/decoding/',
               'jax_transformer/runtime/xla_options.py')
# The plan suite's sizes on CPU host devices, and its row over all of them.
PLAN_SIZES = (*measure.HOST_SIZES, 'all')
PLAN_CODE = ('jax_transformer/compile/step_model.py',
             'jax_transformer/compile/hlo_stats.py', 'jax_transformer/plan/',
             'jax_transformer/bench/plan.py')
# What a hard-killed run's goodput depends on: the trainer, its
# checkpoints and the soak that kills it.
SOAK_CODE = ('jax_transformer/train/', 'scripts/soak.py',
             'scripts/soak_hosts.py')
SOAK_COMMAND = ('JAX_PLATFORMS=cpu python scripts/soak.py --workdir '
                '/tmp/soak_hosts --config lm_shakespeare --hard_kills 2 '
                '--num_steps 40 --checkpoint_every 8 --local_every 2 '
                '--eval_every 1000 --seed 0')


@dataclasses.dataclass(frozen=True)
class Figure:
  """One documented figure.

  what: the table's first column; suite: the record's suite; where: the
  label fields of the rows it is read from; field: their field; text: the
  cell, formatted with ``m`` (median), ``lo`` and ``hi`` (range) and ``n``
  (rounds); command: what measures it; details: a markdown link to its
  conditions (performance.md's table); measures: the paths whose change
  makes it stale; readme: README's table shows it too.
  """
  what: str
  suite: str
  where: dict[str, Any]
  field: str
  text: str
  command: str
  details: str
  measures: tuple[str, ...]
  readme: bool = False


FIGURES = (
    Figure("the paper-base train step against PyTorch's `nn.Transformer`",
           'cpu', {'model': 'transformer_base', 'step': 'train'}, 'ratio',
           "{m:.2f}x PyTorch's time (rounds {lo:.2f}-{hi:.2f})",
           'python scripts/benchmark.py',
           '[below](#the-step-against-pytorch---suite-cpu)',
           (*STEP_CODE, 'jax_transformer/bench/step.py',
            'jax_transformer/interop/torch_reference.py'), readme=True),
    Figure('the paper-base forward (logits and loss) against PyTorch',
           'cpu', {'model': 'transformer_base', 'step': 'forward'}, 'ratio',
           "{m:.2f}x PyTorch's time (rounds {lo:.2f}-{hi:.2f})",
           'python scripts/benchmark.py',
           '[below](#the-step-against-pytorch---suite-cpu)',
           (*STEP_CODE, 'jax_transformer/bench/step.py',
            'jax_transformer/interop/torch_reference.py')),
    Figure("the paper-base forward's dots alone against PyTorch's (its "
           'shapes, float32)', 'matmul', {'shape': 'forward_dots'}, 'ratio',
           "{m:.2f}x PyTorch's time (rounds {lo:.2f}-{hi:.2f})",
           'python scripts/benchmark.py --suite matmul',
           '[below](#the-step-against-pytorch---suite-cpu)',
           ('jax_transformer/bench/matmul.py',)),
    Figure('the paper-base train step, compile time', 'cpu',
           {'model': 'transformer_base', 'step': 'train'}, 'compile_s',
           '{m:.1f} s', 'python scripts/benchmark.py',
           '[below](#the-step-against-pytorch---suite-cpu)',
           (*STEP_CODE, 'jax_transformer/bench/step.py')),
    Figure('the paper-base train step with its layers scanned '
           '(`scan_layers=True`) against PyTorch', 'cpu',
           {'model': 'transformer_base_scan', 'step': 'train'}, 'ratio',
           "{m:.2f}x PyTorch's time (rounds {lo:.2f}-{hi:.2f})",
           'python scripts/benchmark.py --models transformer_base_scan',
           '[below](#the-step-against-pytorch---suite-cpu)',
           (*STEP_CODE, 'jax_transformer/bench/step.py',
            'jax_transformer/interop/torch_reference.py')),
    Figure('the paper-base train step with its layers scanned, compile time',
           'cpu', {'model': 'transformer_base_scan', 'step': 'train'},
           'compile_s', '{m:.1f} s',
           'python scripts/benchmark.py --models transformer_base_scan',
           '[below](#the-step-against-pytorch---suite-cpu)',
           (*STEP_CODE, 'jax_transformer/bench/step.py')),
    Figure('the default LM train step against Hugging Face GPT-2', 'cpu',
           {'model': 'default_lm', 'step': 'train'}, 'ratio',
           "{m:.2f}x its time (rounds {lo:.2f}-{hi:.2f})",
           'python scripts/benchmark.py',
           '[below](#the-step-against-pytorch---suite-cpu)',
           (*STEP_CODE, 'jax_transformer/bench/step.py')),
    Figure('greedy GPT-2 small decoding against Hugging Face `generate`, '
           'batch 1', 'decode', {'model': 'gpt2_small', 'side': 'jax',
                                 'batch': 1}, 'speed_vs_hf',
           '{m:.2f}x its speed (rounds {lo:.2f}-{hi:.2f})',
           'python scripts/benchmark_decode.py',
           '[decoding.md](decoding.md#speed)',
           (*DECODE_CODE, 'jax_transformer/bench/decode.py'), readme=True),
    Figure('greedy GPT-2 small decoding against Hugging Face `generate`, '
           'batch 8', 'decode', {'model': 'gpt2_small', 'side': 'jax',
                                 'batch': 8}, 'speed_vs_hf',
           '{m:.2f}x its speed (rounds {lo:.2f}-{hi:.2f})',
           'python scripts/benchmark_decode.py',
           '[decoding.md](decoding.md#speed)',
           (*DECODE_CODE, 'jax_transformer/bench/decode.py')),
    Figure('a LoRA (r=8) train step against full fine-tuning, GPT-2 small '
           'shape', 'lora', {'step': 'train'}, 'ratio',
           '{m:.2f}x its time (rounds {lo:.2f}-{hi:.2f})',
           'python scripts/benchmark.py --suite lora',
           '[finetune.md](finetune.md#lora)',
           (*STEP_CODE, 'jax_transformer/model/lora.py',
            'jax_transformer/bench/lora.py'), readme=True),
    Figure("the input pipeline against an H200's demand (base model, 40% "
           'MFU)', 'pipeline', {'model': 'transformer_base',
                               'device': 'NVIDIA H200'}, 'ratio',
           '{m:.2f}x', 'python scripts/benchmark.py --suite pipeline',
           '[below](#input-pipeline---suite-pipeline)',
           ('jax_transformer/data/', 'jax_transformer/bench/pipeline.py')),
    Figure('lm-eval tasks (the bundled three, 200 documents each) against '
           "lm-eval's own Hugging Face backend, GPT-2 small shape",
           'harness', {}, 'ratio',
           '{m:.2f}x its wall time (rounds {lo:.2f}-{hi:.2f})',
           'python scripts/benchmark.py --suite harness',
           '[evaluation.md](evaluation.md#speed)',
           (*DECODE_CODE, 'jax_transformer/harness/',
            'jax_transformer/bench/harness.py'), readme=True),
    Figure('the server against `transformers serve --continuous-batching`, '
           'GPT-2 small shape, 32 streaming clients', 'serve',
           {'clients': 32}, 'throughput_ratio',
           '{m:.2f}x its throughput (rounds {lo:.2f}-{hi:.2f})',
           'python scripts/benchmark.py --suite serve',
           '[serving.md](serving.md#measured)',
           (*DECODE_CODE, 'jax_transformer/serving/',
            'jax_transformer/bench/serve.py'), readme=True),
    Figure('the default job against nanoGPT, wall time at equal steps',
           'nanogpt', {}, 'wall_ratio',
           "{m:.2f}x nanoGPT's (rounds {lo:.2f}-{hi:.2f})",
           'python scripts/benchmark.py --suite nanogpt --nanogpt_dir '
           '~/nanoGPT', '[below](#the-default-job-against-nanogpt---suite-'
           'nanogpt)', (*STEP_CODE, 'jax_transformer/data/',
                        'jax_transformer/train/'), readme=True),
    *(Figure('a train step with rows split over the sequence axis against '
             f'heads split over tensor, 2 x {n} tokens, 8 CPU host devices',
             'sequence', {'shape': f'2x{n}'}, 'ratio',
             "{m:.2f}x the tensor layout's time (rounds {lo:.2f}-{hi:.2f})",
             'python scripts/benchmark.py --suite sequence',
             '[scaling.md](scaling.md#step-time-against-row-length-measured)',
             (*STEP_CODE, 'jax_transformer/bench/sequence.py'))
      for n in SEQUENCE_LENGTHS),
    *(Figure("the step model's order of layouts against measured steps' "
             f'order, {size} (8 CPU host devices)', 'plan', {'size': size},
             'spearman', "Spearman's rank correlation {m:.2f}",
             'python scripts/benchmark.py --suite plan',
             '[planning.md](planning.md#the-agreement-at-each-cost-version)',
             (*STEP_CODE, *PLAN_CODE))
      for size in PLAN_SIZES),
    *(Figure(f'goodput of a two-process run hard-killed twice in 40 steps, '
             f'{name}', 'soak', {'configuration': configuration}, 'goodput',
             '{m:.1%}', SOAK_COMMAND,
             '[reliability.md](reliability.md#the-soak-test)', SOAK_CODE)
      for configuration, name in (
          ('workdir_only', 'checkpoints in the workdir alone'),
          ('local_tier', 'with the local tier'))),
)


def rows_of(rec: dict[str, Any], where: dict[str, Any]) -> list[dict]:
  return [r for r in rec['rows']
          if all(r.get(k) == v for k, v in where.items())]


def value(rec: dict[str, Any], figure: Figure) -> dict[str, float] | None:
  """The figure's median, range and n in the record (None: not there)."""
  found = [v for k, v in record.figures(rows_of(rec, figure.where)).items()
           if k.rsplit('/', 1)[-1] == figure.field]
  return found[0] if len(found) == 1 else None


def newest(records: list[dict[str, Any]], figure: Figure
           ) -> tuple[dict[str, Any], dict[str, float]] | None:
  """The newest record holding the figure, and its value: the newest of
  the machines' newest."""
  hits = newest_per_machine(records, figure)
  return hits[0] if hits else None


def newest_per_machine(records: list[dict[str, Any]], figure: Figure
                       ) -> list[tuple[dict[str, Any], dict[str, float]]]:
  """The newest record holding the figure on each machine the records
  name (machines as ``machine_text`` writes them), newest first."""
  seen, out = set(), []
  for rec in reversed(records):
    if rec['suite'] != figure.suite:
      continue
    got = value(rec, figure)
    where = machine_text(rec['machine'])
    if got is not None and where not in seen:
      seen.add(where)
      out.append((rec, got))
  return out


def changed_since(commit: str | None, paths: tuple[str, ...]) -> list[str]:
  """Which of paths differ now from ``commit`` (all where it is unknown)."""
  if not commit:
    return list(paths)
  out = subprocess.run(['git', 'diff', '--name-only', commit, '--', *paths],
                       cwd=record.ROOT, capture_output=True, text=True,
                       check=False)
  if out.returncode:
    return list(paths)  # the commit is not in this clone
  return sorted(out.stdout.split())


def machine_text(machine: dict[str, Any]) -> str:
  """'Intel(R) Xeon(R) Processor, 2 cores, AVX-512, AMX' and the like."""
  isa = machine.get('isa', [])
  widest = (('AVX-512', 'avx512f'), ('AMX', 'amx_tile')) if 'avx512f' in isa \
      else (('AVX2', 'avx2'),)
  marks = [name for name, flag in widest if flag in isa]
  parts = [machine['cpu'], f"{machine['cores']} cores", *marks]
  if machine.get('accelerator'):
    parts.append(machine['accelerator'])
  return ', '.join(parts)


def cell(figure: Figure, rec: dict[str, Any], got: dict[str, float]) -> str:
  """The measured cell: the figure, and where it is stale, why."""
  text = figure.text.format(m=got['median'], lo=got['min'], hi=got['max'],
                            n=got['n'])
  changed = changed_since(rec.get('commit'), figure.measures)
  if rec.get('changed_tree'):
    text += ' (measured on a changed tree)'
  if changed:
    text += (f"; **stale**: {', '.join(f'`{p}`' for p in changed[:3])}"
             f"{' ...' if len(changed) > 3 else ''} changed since")
  return text


# README's table of predictions: each config at 1M tokens a step (its
# shipped layout) on each target, from ``compile_at_size.py --record``.
PREDICTED_TARGETS = ('v5p-128', 'v5e-256', 'v6e-256', 'h100-64')
PREDICTED_CONFIGS = ('lm_1_3b', 'lm_7b')
# Their shipped rows, and the rows of 1M tokens a step.
PREDICTED_SEQ_LEN = {'lm_1_3b': 1024, 'lm_7b': 2048}
PREDICTED_TOKENS = 1 << 20
# What a prediction is made from: the step model, the HLO it reads, and
# the programs compiled (a change to any makes a compiled row stale).
PREDICTION_READS = ('jax_transformer/compile/step_model.py',
                    'jax_transformer/compile/hlo_stats.py',
                    'jax_transformer/model', 'jax_transformer/train/steps.py')


def newest_prediction(records: list[dict[str, Any]], target: str,
                      config: str) -> tuple[dict, dict] | None:
  """The newest predicted record of config compiled for target (one
  slice) at its shipped row length and 1M tokens a step, and its row."""
  for rec in reversed(records):
    for row in rec['rows']:
      if (row.get('target') == target and row.get('config') == config
          and row.get('slices', 1) == 1
          and row.get('seq_len') == PREDICTED_SEQ_LEN.get(config)
          and row['seq_len'] * row['batch_size'] == PREDICTED_TOKENS
          and row.get('predicted_mfu') is not None):
        return rec, row
  return None


def prediction_cell(rec: dict[str, Any], row: dict[str, Any]) -> str:
  """'82% (3%)': predicted MFU (links' share), and where it is stale, why."""
  text = f"{row['predicted_mfu']:.0%} ({row['link_share']:.0%})"
  if row.get('cost_version') != step_model.COST_VERSION:
    return (text + f"; **stale**: step model v{row.get('cost_version')}, "
            f'now v{step_model.COST_VERSION}')
  changed = changed_since(rec.get('commit'), PREDICTION_READS)
  if changed:
    text += (f"; **stale**: {', '.join(f'`{p}`' for p in changed[:2])}"
             f"{' ...' if len(changed) > 2 else ''} changed since")
  return text
