"""Score a trained workdir on a split: BLEU and chrF, or loss and perplexity.

    python scripts/evaluate.py --workdir runs/translate_ende            # beam 4
    python scripts/evaluate.py --workdir runs/translate_ende \
        --average_last 5 --beam_size 4 --alpha 0.6       # the paper's settings
    python scripts/evaluate.py --workdir runs/lm_shakespeare    # perplexity

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

Prints one JSON object: the metrics, the step(s) read, the settings. Bad
input is one sentence on stderr and exit code 2.
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
  return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
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
  from jax_transformer.train import evaluation  # pylint: disable=g-import-not-at-top
  sources, refs = evaluation.split_texts(wd.config.data, split,
                                         args.max_examples)
  start = time.perf_counter()
  hyps = evaluation.translate(
      wd.model(params), wd.tokenizer, sources, beam_size=args.beam_size,
      alpha=args.alpha, batch_size=args.batch_size, mesh=mesh, progress=True)
  seconds = time.perf_counter() - start
  scores = evaluation.bleu_and_chrf(hyps, refs)
  return dict(scores, examples=len(sources), decode_seconds=seconds), {
      'sources.txt': sources, 'hypotheses.txt': hyps, 'references.txt': refs}


def evaluate_lm(wd, params, mesh, args, split: str) -> dict:
  import jax  # pylint: disable=g-import-not-at-top

  from jax_transformer.train import evaluation, steps  # pylint: disable=g-import-not-at-top
  eval_step = jax.jit(steps.make_eval_step(wd.setup.model_def))
  metrics = evaluation.loss_metrics(
      eval_step, params, wd.config.data, wd.tokenizer, mesh,
      (args.batch_size, wd.config.seq_len), split, count_text=True,
      progress=True)
  return {k.removeprefix('eval_'): v for k, v in metrics.items()}, {}


def run(args: argparse.Namespace) -> dict:
  """Scores the workdir; returns the printed JSON object."""
  from jax_transformer.data import corpus  # pylint: disable=g-import-not-at-top
  from jax_transformer.model import sharding
  from jax_transformer.train import evaluation  # pylint: disable=g-import-not-at-top
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
  evaluation.check_split(cfg.data, split)
  if args.batch_size is None:
    args.batch_size = cfg.eval_batch_size
  mesh = restore.inference_mesh(wd)  # the training mesh, on this host
  sharding.check_batch(args.batch_size, mesh)
  params = restore.restore_params(wd, chosen, mesh)
  translation = cfg.model_kind == 'encoder_decoder'
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
  print(json.dumps(run(parse_args(argv))))
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
