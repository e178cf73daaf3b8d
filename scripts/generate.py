"""Translate or continue one text with a trained checkpoint.

    python scripts/generate.py --workdir runs/wmt --input "Ein Haus."
    python scripts/generate.py --workdir runs/lm --input "Once upon" \
        --temperature 0.8 --top_p 0.9 --seed 1
    python scripts/generate.py --workdir runs/wmt --input "..." --beam_size 4

An encoder-decoder translates the input (the source sentence, ending in EOS
as in training) and prints the translation; a decoder-only model continues
the input (laid out as in training: BOS first unless the model was trained
on a token stream) and prints the input followed by its continuation. Greedy by default; ``--beam_size > 1`` runs
beam search, ``--temperature/--top_k/--top_p`` sample. Bad input is one
sentence on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

try:
  import jax_transformer  # noqa: F401
except ImportError:  # Run from a checkout without installing the package.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))))

import jax
import numpy as np

from jax_transformer import data, decoding
from jax_transformer.models import EncoderDecoder
from jax_transformer.sampling import Sampler, greedy

BAD_INPUT = 2
EOS_ID = data.EOS_ID


class InputError(ValueError):
  """Something wrong with the command line or the text: exit code 2."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      description='Translate (encoder-decoder) or continue (decoder-only) '
                  'a text with a trained checkpoint.')
  p.add_argument('--workdir', required=True,
                 help='training directory holding the checkpoint and the '
                      'tokenizer')
  p.add_argument('--input', required=True,
                 help='the source sentence, or the prompt to continue')
  p.add_argument('--beam_size', type=int, default=1,
                 help='> 1: beam search (deterministic)')
  p.add_argument('--alpha', type=float, default=0.6,
                 help='beam search length penalty ((5 + len) / 6) ** alpha')
  p.add_argument('--temperature', type=float, default=None,
                 help='sample at this temperature (0: greedy)')
  p.add_argument('--top_k', type=int, default=None,
                 help='sample among the k most likely tokens')
  p.add_argument('--top_p', type=float, default=None,
                 help='sample from the nucleus of probability p')
  p.add_argument('--max_new_tokens', type=int, default=None,
                 help='most tokens to generate (default: input tokens + 50)')
  p.add_argument('--seed', type=int, default=0, help='sampling seed')
  return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
  """Raises InputError for anything wrong before the checkpoint is read."""
  if not args.input.strip():
    raise InputError('--input is empty; give the text to translate or to '
                     'continue.')
  if args.beam_size < 1:
    raise InputError(f'--beam_size must be at least 1, got {args.beam_size}.')
  sampling = (args.temperature, args.top_k, args.top_p)
  if args.beam_size > 1 and any(x is not None for x in sampling):
    raise InputError('Beam search does not sample: drop --temperature, '
                     '--top_k and --top_p, or use --beam_size 1.')
  if args.alpha < 0:
    raise InputError(f'--alpha must be >= 0, got {args.alpha}.')
  if args.max_new_tokens is not None and args.max_new_tokens < 1:
    raise InputError('--max_new_tokens must be at least 1, got '
                     f'{args.max_new_tokens}.')
  make_sampler(args)


def make_sampler(args: argparse.Namespace):
  """greedy unless a sampling flag is given."""
  if all(x is None for x in (args.temperature, args.top_k, args.top_p)):
    return greedy
  try:
    return Sampler(1.0 if args.temperature is None else args.temperature,
                   args.top_k, args.top_p)
  except ValueError as e:
    raise InputError(str(e).replace('Sampler: ', '--', 1)) from None


def encode_input(text: str, tokenizer, model,
                 stream: bool = False) -> dict[str, np.ndarray]:
  """The model's inputs for one text, laid out as in training.

  Encoder-decoder: src_ids = [ids + EOS]; decoder-only: prompt_ids =
  [BOS + ids], or [ids] for a model trained on a token stream.
  """
  ids = list(tokenizer.encode(text))
  if not ids:
    raise InputError('The input encodes to no tokens; give some text.')
  if isinstance(model, EncoderDecoder):
    return {'src_ids': np.array([data.translation_source(ids)], np.int32)}
  return {'prompt_ids': np.array([data.lm_prompt(ids, stream)], np.int32)}


def _new_tokens(args, model, inputs) -> int:
  width = next(iter(inputs.values())).shape[1]
  if args.max_new_tokens is not None:
    return args.max_new_tokens
  n = width + 50
  config = model.config
  if config.positional == 'learned':
    # The prompt/prefix length the decoder sees.
    prompt = 1 if isinstance(model, EncoderDecoder) else width
    n = min(n, config.max_len - prompt)
  return max(n, 1)


def run(model, tokenizer, args: argparse.Namespace,
        stream: bool = False) -> str:
  """The text to print for args.input (the checkpoint already loaded):
  the translation, or the input followed by its continuation."""
  check_args(args)
  inputs = encode_input(args.input, tokenizer, model, stream)
  n = _new_tokens(args, model, inputs)
  try:
    if args.beam_size > 1:
      out = decoding.beam_search(model, **inputs, beam_size=args.beam_size,
                                 alpha=args.alpha, max_len=n)
    else:
      sampler = make_sampler(args)
      out = decoding.generate(model, **inputs, max_new_tokens=n,
                              sampler=sampler,
                              key=jax.random.key(args.seed))
  except ValueError as e:
    raise InputError(str(e)) from None
  tokens = decoding.row_tokens(out, 0)
  if tokens and tokens[-1] == EOS_ID:
    tokens = tokens[:-1]
  text = tokenizer.decode(tokens)
  return text if isinstance(model, EncoderDecoder) else args.input + text


def _load(workdir: str):
  """(model, tokenizer, stream): stream if an LM saw raw token windows."""
  from jax_transformer import checkpoint  # pylint: disable=g-import-not-at-top
  model, tokenizer = checkpoint.load_for_inference(workdir)
  cfg = checkpoint.load_config(workdir)
  stream = (not isinstance(model, EncoderDecoder)
            and data.get_spec(cfg.data.name).lm_mode == 'stream')
  return model, tokenizer, stream


def main(argv: Sequence[str] | None = None,
         load: Callable[[str], tuple] | None = None) -> int:
  """load(workdir) -> (model, tokenizer, stream); tests inject one."""
  args = parse_args(argv)
  try:
    check_args(args)
    if not os.path.isdir(args.workdir):
      raise InputError(f'--workdir {args.workdir} is not a directory.')
    model, tokenizer, stream = (load or _load)(args.workdir)
    print(run(model, tokenizer, args, stream))
  except InputError as e:
    print(f'generate.py: {e}', file=sys.stderr)
    return BAD_INPUT
  return 0


if __name__ == '__main__':
  sys.exit(main())
