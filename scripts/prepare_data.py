"""Builds a dataset and its tokenizer, then prints what was made.

  python scripts/prepare_data.py --dataset shakespeare
  python scripts/prepare_data.py --dataset ding_en_de --data_dir /data/tfds
  python scripts/prepare_data.py --dataset wmt14_translate/de-en

Data goes under --data_dir (default: $TFDS_DATA_DIR, else
~/tensorflow_datasets). Running it again is cheap: what exists is reused.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from jax_transformer import cli
from jax_transformer.data import datasets


def parse_args(argv=None) -> argparse.Namespace:
  p = cli.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--dataset', required=True, choices=sorted(datasets.DATASETS))
  p.add_argument('--data_dir', default=None,
                 help='TFDS data dir (default: %(default)s -> '
                 f'{datasets.default_data_dir()})')
  p.add_argument('--tokenizer', choices=('byte', 'sentencepiece'),
                 default=None, help="default: the dataset's")
  p.add_argument('--vocab_size', type=int, default=None,
                 help="SentencePiece size (default: the dataset's)")
  p.add_argument('--model_type', choices=('unigram', 'bpe'),
                 default='unigram')
  p.add_argument('--num_examples', type=int, default=3,
                 help='examples to show decoded')
  return p.parse_args(argv)


def describe_lengths(spec, source, tokenizer, limit: int = 2000) -> str:
  """Token counts over the first examples, to help choose seq_len."""
  keys = spec.languages if spec.task == 'translation' else (spec.text_key,)
  parts = []
  for key in keys:
    n = [len(tokenizer.encode(datasets.as_text(source[i][key])))
         for i in range(min(limit, len(source)))]
    parts.append(f'{key}: mean {np.mean(n):.1f}, p95 '
                 f'{np.percentile(n, 95):.0f}, max {max(n)}')
  return '; '.join(parts)


def show_examples(spec, source, tokenizer, count: int) -> None:
  keys = spec.languages if spec.task == 'translation' else (spec.text_key,)
  for i in range(min(count, len(source))):
    example = source[i]
    print(f'  example {i}:')
    for key in keys:
      text = datasets.as_text(example[key])
      ids = tokenizer.encode(text)
      decoded = tokenizer.decode(ids)
      status = 'round trip ok' if decoded == text else 'DIFFERS'
      print(f'    {key} ({len(ids)} tokens, {status}): {decoded!r}')
      if tokenizer.kind == 'sentencepiece':
        pieces = [tokenizer.id_to_piece(t) for t in ids[:16]]
        print(f'    {key} pieces: {" ".join(pieces)}'
              f'{" ..." if len(ids) > 16 else ""}')


@cli.entry_point('prepare_data.py')
def main(argv=None) -> int:
  args = parse_args(argv)
  start = time.time()
  prepared = datasets.prepare(
      args.dataset, args.data_dir, tokenizer=args.tokenizer,
      vocab_size=args.vocab_size, model_type=args.model_type)
  elapsed = time.time() - start
  spec = prepared.spec
  print(f'dataset:    {spec.name} ({spec.task})')
  print(f'data_dir:   {prepared.data_dir}')
  for split, n in sorted(prepared.num_examples.items()):
    print(f'split:      {split}: {n} examples')
  print(f'tokenizer:  {prepared.tokenizer!r} in {prepared.tokenizer_dir}')
  print(f'vocab_size: {prepared.vocab_size}')
  print(f'prepared in {elapsed:.1f} s')
  source = datasets.load_source(spec.name, spec.train_split,
                                prepared.data_dir)
  print(f'train tokens per example: '
        f'{describe_lengths(spec, source, prepared.tokenizer)}')
  show_examples(spec, source, prepared.tokenizer, args.num_examples)
  return 0


if __name__ == '__main__':
  sys.exit(main())
