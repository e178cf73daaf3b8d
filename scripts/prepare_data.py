"""Builds a dataset and its tokenizer, then prints what was made.

  python scripts/prepare_data.py --config lm_1_3b          # what a run reads
  python scripts/prepare_data.py --config lm_shakespeare \
      --config.data.name=files --config.data.files.train='texts/*.txt'
  python scripts/prepare_data.py --dataset shakespeare
  python scripts/prepare_data.py --dataset ding_en_de --data_dir /data/tfds

``--config NAME[:preset]`` with ``--config.data....`` overrides prepares
exactly what ``train.py`` with the same flags will read (dataset,
tokenizer, token stores of its train and eval splits), then says what that
run's rows keep of it (train.py's pre-flight line) and warns where its
lengths exceed them; ``--dataset`` a built-in with its default
tokenizer. Data goes under --data_dir (or config.data.data_dir; default:
$TFDS_DATA_DIR, else ~/tensorflow_datasets).
Running it again is cheap: what exists is reused.

Exit status: 0 prepared; 2 refused in one line; 75 stopped by SIGINT
(Ctrl-C) or SIGTERM, in one line (nothing half-written is read as
prepared: rerun to go on).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from jax_transformer import cli
from jax_transformer.data import datasets, sources
from jax_transformer.errors import UsageError
from jax_transformer.experiment import doors
from jax_transformer.runtime import exits

PROG = 'prepare_data.py'


def parse_args(argv=None, with_config: bool = False) -> argparse.Namespace:
  p = cli.ArgumentParser(prog=PROG,
                         description=__doc__.split('\n\n')[0])
  if not with_config:
    p.add_argument('--dataset', required=True,
                   choices=sorted(datasets.DATASETS))
  p.add_argument('--data_dir', default=None,
                 help='TFDS data dir (default: %(default)s -> '
                 f'{datasets.default_data_dir()})')
  if not with_config:  # a config says these with config.data fields
    p.add_argument('--tokenizer', choices=('byte', 'sentencepiece'),
                   default=None, help="default: the dataset's")
    p.add_argument('--vocab_size', type=int, default=None,
                   help="SentencePiece size (default: the dataset's)")
    p.add_argument('--model_type', choices=('unigram', 'bpe'),
                   default='unigram')
  p.add_argument('--workers', type=int, default=None,
                 help='processes tokenizing a big split (default: '
                 'config.data.prepare_workers, else every core)')
  p.add_argument('--num_examples', type=int, default=3,
                 help='examples to show decoded')
  return p.parse_args(argv)


def raw_speed(tokenizer, texts: list[str]) -> float:
  """Tokens per second of the tokenizer library itself on one core (no
  project code around it), on texts."""
  if tokenizer.kind == 'sentencepiece':
    sp = tokenizer._sp  # pylint: disable=protected-access
    def encode():
      return sum(map(len, sp.encode(texts, num_threads=1)))
  elif tokenizer.kind == 'byte':
    def encode():
      return sum(len(t.encode('utf-8')) for t in texts)
  else:
    def encode():
      return sum(len(tokenizer.encode(t)) for t in texts)
  start = time.perf_counter()
  tokens = encode()
  return tokens / max(time.perf_counter() - start, 1e-9)


def report_speed(prepared, source, elapsed: float,
                 limit: int = 2000) -> None:
  """One line per token store this call wrote: tokens per second per
  core, beside the library's own speed on the same text (not for the
  byte tokenizer, which has no library: its "speed" would be that of
  UTF-8 encoding, billions a second); then the tokens over the whole
  preparation's time (elapsed seconds)."""
  if not prepared.stores:
    return
  library = None
  if prepared.tokenizer.kind != 'byte':
    keys = prepared.spec.text_features
    texts = [datasets.as_text(source[i][k])
             for i in range(min(limit, len(source))) for k in keys]
    library = raw_speed(prepared.tokenizer, texts)
  for split, stats in sorted(prepared.stores.items()):
    mb = stats.text_bytes / 1e6
    compared = ('' if library is None else
                ' (the tokenizer library alone, one core, same text: '
                f'{library:,.0f} tokens/s)')
    print(f'tokenized:  {split}: {stats.examples} examples, {mb:.1f} MB of '
          f'text, {stats.tokens} tokens in {stats.seconds:.1f} s by '
          f'{stats.processes} process{"es" if stats.processes > 1 else ""}'
          f': {stats.tokens_per_second_per_core:,.0f} tokens/s per core'
          f'{compared}')
  tokens = sum(stats.tokens for stats in prepared.stores.values())
  print(f'tokenized:  {tokens} tokens in {elapsed:.1f} s of preparation: '
        f'{tokens / max(elapsed, 1e-9):,.0f} tokens/s from files to token '
        'store')


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


def check_rows(cfg, prepared) -> None:
  """What train.py with the same flags says of this data before its first
  step (data/preflight.py): its line, and a warning where the lengths
  above exceed the run's rows (a refusal, there, is a warning here)."""
  from jax_transformer.data import pipeline  # pylint: disable=g-import-not-at-top
  batches = cfg.train_batches
  for report in pipeline.training_preflight(batches, prepared.tokenizer):
    print(f'at the run\'s rows: {report.line()}')
    warning = report.warning()
    try:
      report.check()
    except UsageError as refusal:
      warning = f'Warning: train.py with these flags would refuse: {refusal}'
    if warning:
      print(warning)


def prepare(argv) -> tuple[datasets.PreparedData, argparse.Namespace, Any]:
  """From --config (with overrides) or --dataset; the config (or None)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  spec, _ = cli.split_config_spec(argv)
  if spec is None:
    args = parse_args(argv)
    return datasets.prepare(
        args.dataset, args.data_dir, tokenizer=args.tokenizer,
        vocab_size=args.vocab_size, model_type=args.model_type), args, None
  rest = cli.split_config_spec(argv)[1]
  overrides = [a for a in rest if a.lstrip('-').startswith(
      ('config.', 'noconfig.'))]
  config, _, _ = cli.parse_config_flags([PROG, '--config', spec, *overrides])
  args = parse_args([a for a in rest if a not in overrides],
                    with_config=True)
  cfg = doors.from_command_line(config)
  if args.data_dir:
    cfg = cfg.replace(**{'data.data_dir': args.data_dir})
  return sources.prepare_for(cfg.data, seq_len=cfg.seq_len,
                             workers=args.workers), args, cfg


class Stopped(KeyboardInterrupt):
  """SIGTERM, raised where Python raises SIGINT's KeyboardInterrupt."""


@contextlib.contextmanager
def stop_signals():
  """SIGTERM raises Stopped, as SIGINT raises KeyboardInterrupt (in the
  main thread; its previous handler put back after)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  def stop(signum, frame):
    del signum, frame
    raise Stopped()
  previous = signal.signal(signal.SIGTERM, stop)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


@cli.entry_point(PROG)
def main(argv=None) -> int:
  """Prepares and reports; a stop signal ends it in one line, exit 75."""
  try:
    with stop_signals():
      return _main(argv)
  except KeyboardInterrupt as e:
    name = 'SIGTERM' if isinstance(e, Stopped) else 'SIGINT'
    print(f'{PROG}: {name} while preparing the data: stopped; nothing '
          'half-written is read as prepared, and what was finished is '
          'kept: rerun to go on.', file=sys.stderr, flush=True)
    return exits.EXIT_INTERRUPTED


def _main(argv=None) -> int:
  start = time.time()
  prepared, args, cfg = prepare(argv)
  elapsed = time.time() - start
  spec = prepared.spec
  print(f'dataset:    {spec.name} ({spec.task})')
  print(f'data_dir:   {prepared.data_dir}')
  for split, n in sorted(prepared.num_examples.items()):
    print(f'split:      {split}: {n} examples')
  print(f'tokenizer:  {prepared.tokenizer!r} in {prepared.tokenizer_dir}')
  print(f'vocab_size: {prepared.vocab_size}')
  print(f'prepared in {elapsed:.1f} s')
  source = datasets.load_source(spec, spec.train_split, prepared.data_dir)
  report_speed(prepared, source, elapsed)
  print(f'train tokens per example: '
        f'{describe_lengths(spec, source, prepared.tokenizer)}')
  if cfg is not None and not cfg.data.mixture:
    check_rows(cfg, prepared)
  show_examples(spec, source, prepared.tokenizer, args.num_examples)
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
