"""Score a trained workdir on a split: BLEU and chrF, or loss and perplexity.

    python scripts/evaluate.py --workdir runs/translate_ende            # beam 4
    python scripts/evaluate.py --workdir runs/translate_ende \
        --average_last 5 --beam_size 4 --alpha 0.6       # the paper's settings
    python scripts/evaluate.py --workdir runs/lm_shakespeare    # perplexity
    python scripts/evaluate.py --workdir runs/lm_shakespeare \
        --tasks shakespeare_next_line,shakespeare_bpb --limit 100  # lm-eval

Translation: decodes the split with the KV-cached beam search (greedy with
``--beam_size 1``), detokenizes, and scores with sacrebleu (corpus BLEU and
chrF, with signatures) against the split's raw reference text. Writes
sources.txt, hypotheses.txt, references.txt and metrics.json under
DIR/eval/<split>-step<N>/ (``-avg<K>`` appended when averaging).

Language model: loss, perplexity and bits per byte (byte tokenizer) or per
character (SentencePiece) over every token of the split, as the trainer's
evaluation computes them.

The workdir may be local or ``gs://`` (the eval/ files go beside it); the
parameters are restored over this machine's devices as training sharded
them (``restore.inference_mesh``), so one host of a pod scores what the pod
trained.

With ``--tasks`` it scores lm-evaluation-harness tasks instead
(``jax_transformer.harness``; needs ``pip install -e '.[eval]'``), with
lm-eval's own flags (``--num_fewshot``, ``--limit``, ``--include_path``,
``--output_path``, ``--log_samples``, ``--seed``, ``--bootstrap_iters``),
prints lm-eval's results table and writes results.json (and
samples_<task>.jsonl with ``--log_samples``) to
DIR/eval/harness-step<N>/ or ``--output_path``. ``--workdir`` may then also
be a Hugging Face folder, read directly (nothing is written there: give
``--output_path`` to keep the files).

Prints one JSON object: the metrics, the step(s) read, the settings (with
``--tasks``: lm-eval's table). Bad input is one sentence on stderr and exit
code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Sequence

from jax_transformer import cli
from jax_transformer.errors import UsageError
from jax_transformer.model import families
from jax_transformer.runtime import compile_cache, storage
from jax_transformer.runtime.workdir import resolve

PROG = 'evaluate.py'


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = cli.ArgumentParser(
      prog=PROG,
      description='Score a trained model: BLEU/chrF (translation) or '
                  'loss/perplexity/bits (language model).')
  p.add_argument('--workdir', required=True, help='the training directory')
  p.add_argument('--split', default=None,
                 help="TFDS split, slices allowed ('train[-500:]'); default "
                      "the config's eval split")
  p.add_argument('--step', type=int, default=None,
                 help='checkpoint step (default: the latest)')
  p.add_argument('--average_last', type=int, default=1,
                 help='average the parameters of the last K checkpoints up '
                      'to --step (the paper averages 5)')
  p.add_argument('--beam_size', type=int, default=4,
                 help='beam width; 1 decodes greedily')
  p.add_argument('--alpha', type=float, default=0.6,
                 help='length penalty ((5 + len) / 6) ** alpha')
  p.add_argument('--max_examples', type=int, default=None,
                 help='translate only the first N examples')
  p.add_argument('--batch_size', type=int, default=None,
                 help="sentences decoded (or LM rows scored) per batch; "
                      "default the config's eval_batch_size")
  p.add_argument('--compilation_cache_dir',
                 default=compile_cache.DEFAULT_DIR, help=compile_cache.HELP)
  harness = p.add_argument_group(
      'lm-evaluation-harness', 'score lm-eval tasks instead (--tasks)')
  harness.add_argument('--tasks', default=None,
                       help='lm-eval task or group names, comma-separated '
                            '(the bundled shakespeare_next_line, '
                            'shakespeare_continue, shakespeare_bpb among '
                            'them)')
  harness.add_argument('--num_fewshot', type=int, default=None,
                       help="examples in each prompt (default: the task's)")
  harness.add_argument('--limit', default=None,
                       help='documents per task: a count, or a fraction < 1')
  harness.add_argument('--include_path', default=None,
                       help='a folder of task YAML files to add')
  harness.add_argument('--output_path', default=None,
                       help='where results.json and the samples go (default '
                            'WORKDIR/eval/harness-step<N>/)')
  harness.add_argument('--log_samples', action='store_true',
                       help='write every request and answer per task')
  harness.add_argument('--seed', type=int, default=0,
                       help="lm-eval's seeds (python, numpy, few-shot) and "
                            'the sampling key')
  harness.add_argument('--bootstrap_iters', type=int, default=100000,
                       help="lm-eval's bootstrap for the standard errors of "
                            'non-mean metrics (0: none)')
  return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
  if args.tasks is None:
    given = [f'--{k}' for k in ('num_fewshot', 'limit', 'include_path',
                                'output_path') if getattr(args, k) is not None]
    given += ['--log_samples'] * args.log_samples
    if given:
      raise UsageError(f'{", ".join(given)} go with --tasks (lm-eval tasks).')
  else:
    if args.average_last != 1 or args.split is not None:
      raise UsageError('--average_last and --split go without --tasks; lm-eval '
                       'tasks read their own data.')
    if args.num_fewshot is not None and args.num_fewshot < 0:
      raise UsageError(f'--num_fewshot must be >= 0, got {args.num_fewshot}.')
    if args.bootstrap_iters < 0:
      raise UsageError('--bootstrap_iters must be >= 0, got '
                       f'{args.bootstrap_iters}.')
  if args.beam_size < 1:
    raise UsageError(f'--beam_size must be at least 1, got {args.beam_size}.')
  if args.alpha < 0:
    raise UsageError(f'--alpha must be >= 0, got {args.alpha}.')
  for name in ('average_last', 'max_examples', 'batch_size'):
    value = getattr(args, name)
    if value is not None and value < 1:
      raise UsageError(f'--{name} must be at least 1, got {value}.')


def output_dir(workdir, split: str, steps: list[int]):
  """workdir/eval/<split>-step<N>[-avg<K>] (an epath.Path: local or
  gs://, as the workdir)."""
  name = f'{split}-step{steps[-1]}'
  if len(steps) > 1:
    name += f'-avg{len(steps)}'
  return workdir.root / 'eval' / re.sub(r'[^\w.+-]+', '_', name)


def _write_lines(directory, name: str, lines: Sequence[str]) -> None:
  (directory / name).write_text(
      ''.join(line.replace('\n', ' ') + '\n' for line in lines))


def evaluate_translation(wd, params, mesh, args, split: str) -> dict:
  from jax_transformer.train import scores  # pylint: disable=g-import-not-at-top
  sources, refs = scores.split_texts(wd.config.data, split,
                                         args.max_examples)
  start = time.perf_counter()
  hyps = scores.translate(
      wd.model(params), wd.tokenizer, sources, beam_size=args.beam_size,
      alpha=args.alpha, batch_size=args.batch_size, mesh=mesh, progress=True)
  seconds = time.perf_counter() - start
  both = scores.bleu_and_chrf(hyps, refs)
  return dict(both, examples=len(sources), decode_seconds=seconds), {
      'sources.txt': sources, 'hypotheses.txt': hyps, 'references.txt': refs}


def evaluate_lm(wd, params, mesh, args, split: str) -> dict:
  import jax  # pylint: disable=g-import-not-at-top

  from jax_transformer.train import scores, steps  # pylint: disable=g-import-not-at-top
  eval_step = jax.jit(steps.make_eval_step(wd.setup.model_def))
  metrics = scores.loss_metrics(
      eval_step, params, wd.config.data, wd.tokenizer, mesh,
      (args.batch_size, wd.config.seq_len), split, count_text=True,
      progress=True)
  return {k.removeprefix('eval_'): v for k, v in metrics.items()}, {}


def harness_settings(args: argparse.Namespace):
  from jax_transformer.harness import tasks  # pylint: disable=g-import-not-at-top
  return tasks.Settings(
      tasks.parse_tasks(args.tasks), args.num_fewshot,
      tasks.parse_limit(args.limit), args.include_path, args.seed,
      args.log_samples, args.bootstrap_iters)


def _kind_of(workdir: str) -> str:
  """The model kind a workdir (or Hugging Face folder) holds, read from
  its config alone."""
  from jax_transformer.interop import hf_checkpoint  # pylint: disable=g-import-not-at-top
  from jax_transformer.workdirs import restore  # pylint: disable=g-import-not-at-top
  if hf_checkpoint.hf_folder(workdir) is not None:
    return 'decoder_lm'
  return restore.open_workdir(workdir).config.model_kind


def run_harness(args: argparse.Namespace) -> dict:
  """Scores lm-eval tasks; prints lm-eval's table; returns a summary."""
  try:
    from jax_transformer.harness import backend, tasks  # pylint: disable=g-import-not-at-top
  except ModuleNotFoundError as e:
    raise UsageError(f'--tasks needs lm-eval ({e}); install it with pip '
                     "install -e '.[eval]'.") from None
  from jax_transformer.interop import hf_checkpoint  # pylint: disable=g-import-not-at-top
  from jax_transformer.workdirs import restore  # pylint: disable=g-import-not-at-top
  settings = harness_settings(args)
  hf = hf_checkpoint.hf_folder(args.workdir) is not None
  if not hf and not resolve(args.workdir).root.is_dir():
    raise UsageError(f'--workdir {args.workdir} is not a directory; give a '
                     'training workdir or a Hugging Face folder.')
  if families.family(_kind_of(args.workdir)).has_source:
    raise UsageError(backend.ENCODER_DECODER)
  # Before the model is read: an unknown task or unreachable data costs
  # no restore.
  loaded = tasks.load_tasks(settings)
  trained = restore.load_model(args.workdir, args.step)
  batch_size = args.batch_size or trained.config.eval_batch_size
  lm = backend.JaxTransformerLM(trained, batch_size, seed=args.seed)
  start = time.perf_counter()
  results = tasks.evaluate(lm, settings, loaded)
  seconds = time.perf_counter() - start
  print(tasks.table(results))
  shapes = sorted(lm.scorer.shapes)
  print(f'{PROG}: scored in {seconds:.1f} s; {len(shapes)} scoring '
        f'programs compiled (at most {lm.scorer.bound()} for this model: '
        f'rows, width, head positions per row: '
        f'{shapes})', file=sys.stderr)
  out = None
  if args.output_path is not None:
    out = storage.path(args.output_path, '--output_path')
  elif not hf:
    out = resolve(args.workdir).root / 'eval' / f'harness-step{trained.step}'
  summary = {'workdir': args.workdir, 'step': trained.step,
             'tasks': list(settings.tasks),
             'metrics': tasks.metrics(results), 'seconds': seconds,
             'compiled_programs': len(shapes)}
  if out is not None:
    tasks.write(results, out)
    (out / 'summary.json').write_text(json.dumps(summary, indent=2))
    summary['output_dir'] = os.fspath(out)
    print(f'{PROG}: results in {out}', file=sys.stderr)
  else:
    print(f'{PROG}: nothing written into the Hugging Face folder; give '
          '--output_path to keep results.json', file=sys.stderr)
  return summary


def run(args: argparse.Namespace) -> dict:
  """Scores the workdir; returns the printed JSON object."""
  from jax_transformer.data import corpus  # pylint: disable=g-import-not-at-top
  from jax_transformer.model import sharding
  from jax_transformer.train import scores  # pylint: disable=g-import-not-at-top
  from jax_transformer.workdirs import restore  # pylint: disable=g-import-not-at-top
  check_args(args)
  # Local or gs://, as training accepts it; one sentence if it is not there.
  wd = restore.open_workdir(args.workdir)
  chosen = restore.choose_steps(wd, args.step, args.average_last)
  cfg = wd.config
  split = args.split or cfg.data.eval_split
  # Your files' prepared dataset gone too: one sentence saying so.
  gone = corpus.gone(wd.data_record, split, args.workdir)
  if gone:
    raise UsageError(gone)
  scores.check_split(cfg.data, split)
  if args.batch_size is None:
    args.batch_size = cfg.eval_batch_size
  mesh = restore.inference_mesh(wd)  # the training mesh, on this host
  sharding.check_batch(args.batch_size, mesh)
  params = restore.restore_params(wd, chosen, mesh)
  translation = families.family(cfg.model_kind).has_source
  try:
    metrics, files = (evaluate_translation if translation else evaluate_lm)(
        wd, params, mesh, args, split)
  except FileNotFoundError as e:  # the split's data is not prepared
    raise UsageError(str(e)) from None
  result = {'workdir': args.workdir, 'split': split, 'step': chosen[-1],
            'averaged_steps': chosen, 'metrics': metrics,
            'settings': {k: v for k, v in vars(args).items()
                         if k not in ('workdir', 'split')}}
  if not translation:
    result['settings'] = {'batch_size': args.batch_size,
                          'average_last': args.average_last}
  out = output_dir(wd.paths, split, chosen)
  out.mkdir(parents=True, exist_ok=True)
  for name, lines in files.items():
    _write_lines(out, name, lines)
  result['output_dir'] = os.fspath(out)
  (out / 'metrics.json').write_text(json.dumps(result, indent=2))
  return result


@cli.entry_point(PROG)
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  check_args(args)
  storage.check_reachable(args.workdir)  # a gs:// bucket answers, at once
  import jax  # pylint: disable=g-import-not-at-top
  compile_cache.use(jax.config, args.compilation_cache_dir)
  if args.tasks is not None:
    run_harness(args)
    return 0
  print(json.dumps(run(args)))
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
