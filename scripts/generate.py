"""Translate or continue a text, or each line of a file, with a checkpoint.

    python scripts/generate.py --workdir runs/wmt --input "Ein Haus."
    python scripts/generate.py --workdir runs/lm --input "Once upon" \
        --temperature 0.8 --top_p 0.9 --seed 1
    python scripts/generate.py --workdir runs/wmt --input "..." --beam_size 4
    python scripts/generate.py --workdir runs/wmt --input_file doc.de \
        --output_file doc.en --beam_size 4 --batch_size 64
    python scripts/generate.py --workdir runs/lm --input "Once upon" \
        --dtype bfloat16 --int8
    python scripts/generate.py --workdir runs/sft \
        --chat '[{"role": "user", "content": "Who is Romeo?"}]'
    python scripts/generate.py --workdir runs/long --input_file book.txt \
        --prefill_chunk 1024 --max_new_tokens 64

An encoder-decoder translates the input (the source sentence, ending in EOS
as in training) and prints the translation; a decoder-only model continues
the input (laid out as in training: BOS first unless the model was trained
on a token stream) and prints the input followed by its continuation.
Greedy by default; ``--beam_size > 1`` runs beam search,
``--temperature/--top_k/--top_p`` sample. ``--dtype bfloat16`` decodes in
bfloat16 (parameters cast once, bfloat16 KV cache, float32 logits);
``--int8`` holds the matmul kernels as int8 with per-channel scales
(``jax_transformer.decoding.quantize``).

``--input_file`` (``-``: stdin) holds one text per line; line i of the
output (``--output_file``, default stdout) answers line i of the input. The
lines are decoded ``--batch_size`` at a time, sorted by length, with a
progress bar on stderr. A blank line gives an empty output line; a newline
inside an output is written as the two characters ``\\n``. Greedy outputs
are the ones each line gets alone with ``--input``.

The workdir may be local or ``gs://`` (as train.py accepts it), and the
checkpoint is sharded over this machine's devices as training sharded it
(``restore.inference_mesh``), so one host of a pod decodes what the pod
trained; each batch is split over the mesh's ``'data'`` axis.

``--chat`` answers a conversation (instruction data's chat records,
``docs/finetune.md``): rendered with the tokenizer's chat template (or the
fixed one) through the assistant's header, as training rendered it, and
the reply printed alone, stopped at EOS or the template's end of turn.

Bad input (an empty ``--input``, a missing or empty file, a line that
encodes to nothing or is too long for the model, bad flag values) is one
sentence on stderr and exit code 2, before any decoding.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

import jax

from jax_transformer import cli
from jax_transformer.data import chat
from jax_transformer.decoding import inference, quantize
from jax_transformer.decoding.sampling import Sampler, greedy
from jax_transformer.errors import UsageError
from jax_transformer.model.families import family_of
from jax_transformer.runtime import storage
from jax_transformer.runtime.workdir import resolve

PROG = 'generate.py'
# Chunks of this many tokens: attention's scores for a chunk of a 32,768-
# token prompt's cache, [N, 2048, 32768] float32, are 256 MiB a head.
PREFILL_CHUNK = 2048


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = cli.ArgumentParser(
      prog=PROG,
      description='Translate (encoder-decoder) or continue (decoder-only) '
                  'a text, or each line of a file, with a trained '
                  'checkpoint.')
  p.add_argument('--workdir', required=True,
                 help='training directory holding the checkpoint and the '
                      'tokenizer')
  source = p.add_mutually_exclusive_group(required=True)
  source.add_argument('--input',
                      help='the source sentence, or the prompt to continue')
  source.add_argument('--input_file',
                      help='a file of texts, one per line (-: stdin); a '
                           'blank line gives an empty output line')
  source.add_argument('--chat',
                      help='a conversation, JSON: [{"role": "user", '
                           '"content": ...}, ...] or a .json file holding '
                           'one; rendered as training rendered chats (the '
                           "tokenizer's chat template, else the fixed one) "
                           "and answered by the assistant; prints the reply")
  p.add_argument('--output_file', default='-',
                 help='with --input_file: where the outputs go, one line '
                      'per input line (default -: stdout)')
  p.add_argument('--batch_size', type=int, default=32,
                 help='texts decoded at once (sorted by length)')
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
                 help='most tokens to generate per text (default: its '
                      'tokens + 50)')
  p.add_argument('--seed', type=int, default=0, help='sampling seed')
  p.add_argument('--prefill_chunk', type=int, default=PREFILL_CHUNK,
                 help='a prompt longer than this many tokens is read a chunk '
                      'at a time: memory bounded by the chunk, the same '
                      'tokens (as serve.py --prefill_chunk)')
  p.add_argument('--dtype', choices=quantize.DTYPES, default=None,
                 help="compute dtype (default: the checkpoint's); "
                      'bfloat16 casts the parameters once')
  p.add_argument('--int8', action='store_true',
                 help='int8 weight-only matmul kernels, one scale per '
                      'output channel')
  return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
  """Raises UsageError for anything wrong before the checkpoint is read."""
  if args.chat is not None:
    read_chat(args.chat)
  if args.input is not None and inference.is_blank(args.input):
    raise UsageError('--input is empty; give the text to translate or to '
                     'continue.')
  if args.output_file != '-':
    if args.input is not None:
      raise UsageError('--output_file goes with --input_file; --input '
                       'prints its output.')
    folder = storage.path(args.output_file, '--output_file').parent
    if not folder.is_dir():
      raise UsageError(f'--output_file {args.output_file}: the folder '
                       f'{folder} does not exist.')
  for flag in ('beam_size', 'batch_size', 'prefill_chunk'):
    if getattr(args, flag) < 1:
      raise UsageError(f'--{flag} must be at least 1, got '
                       f'{getattr(args, flag)}.')
  sampling = (args.temperature, args.top_k, args.top_p)
  if args.beam_size > 1 and any(x is not None for x in sampling):
    raise UsageError('Beam search does not sample: drop --temperature, '
                     '--top_k and --top_p, or use --beam_size 1.')
  if args.alpha < 0:
    raise UsageError(f'--alpha must be >= 0, got {args.alpha}.')
  if args.max_new_tokens is not None and args.max_new_tokens < 1:
    raise UsageError('--max_new_tokens must be at least 1, got '
                     f'{args.max_new_tokens}.')
  make_sampler(args)


def make_sampler(args: argparse.Namespace):
  """greedy unless a sampling flag is given."""
  if all(x is None for x in (args.temperature, args.top_k, args.top_p)):
    return greedy
  try:
    return Sampler(1.0 if args.temperature is None else args.temperature,
                   args.top_k, args.top_p)
  except UsageError as e:
    raise UsageError(str(e).replace('Sampler: ', '--', 1)) from None


def translate_batch(model, tokenizer, texts: Sequence[str],
                    args: argparse.Namespace, stream: bool = False,
                    progress: bool = False, mesh=None) -> list[str]:
  """What to print for each text (the checkpoint already loaded): its
  translation, or the text followed by its continuation ('' for a blank
  text). The decoding flags come from args; each batch is sharded over
  mesh's 'data' axis (the parameters keep theirs); inference.TextError
  names a text that cannot be decoded."""
  outputs = inference.decode_texts(
      model, tokenizer, texts, stream=stream, beam_size=args.beam_size,
      alpha=args.alpha, sampler=make_sampler(args),
      key=jax.random.key(args.seed), max_new_tokens=args.max_new_tokens,
      batch_size=args.batch_size, progress=progress, mesh=mesh,
      prefill_chunk=args.prefill_chunk)
  if family_of(model).has_source:  # a translation replaces its source
    return outputs
  return [text + out if out or not inference.is_blank(text) else ''
          for text, out in zip(texts, outputs)]


def run(model, tokenizer, args: argparse.Namespace,
        stream: bool = False, mesh=None) -> str:
  """The text to print for args.input: its translation, or the input
  followed by its continuation."""
  check_args(args)
  try:
    return translate_batch(model, tokenizer, [args.input], args, stream,
                           mesh=mesh)[0]
  except inference.TextError as e:
    raise UsageError(f'--input {e.reason}.') from None


def read_chat(value: str) -> list[dict]:
  """--chat's messages: JSON, or a .json file holding it; checked."""
  text = value
  if not value.lstrip().startswith('['):
    try:
      text = storage.path(value, '--chat').read_text()
    except OSError as e:
      raise UsageError(f'--chat {value}: neither a JSON list of messages nor '
                       f'a file that can be read ({e.__class__.__name__}).'
                       ) from None
  try:
    messages = json.loads(text)
  except ValueError as e:
    raise UsageError(f'--chat is not JSON ({e}).') from None
  if not isinstance(messages, list) or not messages:
    raise UsageError('--chat must be a non-empty JSON list of {"role": ..., '
                     '"content": ...} messages.')
  # The conversation so far: a reply follows it.
  chat.stored_text([*messages, {'role': 'assistant', 'content': ''}],
                   '--chat')
  return messages


def answer_chat(model, tokenizer, args: argparse.Namespace, mesh=None
                ) -> str:
  """The assistant's reply to --chat, stopped at EOS or the template's
  end of turn."""
  messages = read_chat(args.chat)
  try:
    ids = chat.prompt_ids(tokenizer, messages)
    return inference.decode_texts(
        model, tokenizer, ['chat'], rows=[ids],
        stop_ids=chat.end_of_turn_ids(tokenizer), beam_size=args.beam_size,
        alpha=args.alpha, sampler=make_sampler(args),
        key=jax.random.key(args.seed), max_new_tokens=args.max_new_tokens,
        batch_size=1, mesh=mesh, prefill_chunk=args.prefill_chunk)[0]
  except inference.TextError as e:
    raise UsageError(f'--chat {e.reason}.') from None


def read_lines(path: str) -> list[str]:
  """The lines of a file (- : stdin), without their line ends."""
  try:
    if path == '-':
      text = sys.stdin.read()
    else:
      text = storage.path(path, '--input_file').read_text(encoding='utf-8')
  except FileNotFoundError:
    raise UsageError(f'--input_file {path} does not exist.') from None
  except (OSError, UnicodeDecodeError) as e:
    raise UsageError(f'--input_file {path} cannot be read as UTF-8 text '
                     f'({e}).') from None
  if not text:
    raise UsageError(f'--input_file {path} is empty; give one text per '
                     'line.')
  return [line.rstrip('\r') for line in text.removesuffix('\n').split('\n')]


def write_lines(path: str, lines: Sequence[str]) -> None:
  """One output per line (a newline inside one is written as \\n)."""
  text = ''.join(line.replace('\n', '\\n') + '\n' for line in lines)
  if path == '-':
    sys.stdout.write(text)
    return
  try:
    storage.path(path, '--output_file').write_text(text, encoding='utf-8')
  except OSError as e:
    raise UsageError(f'--output_file {path} cannot be written ({e}).'
                     ) from None


def translate_file(model, tokenizer, lines: Sequence[str],
                   args: argparse.Namespace, stream: bool = False,
                   mesh=None) -> None:
  """Decodes the lines of args.input_file and writes args.output_file."""
  try:
    outputs = translate_batch(model, tokenizer, lines, args, stream,
                              progress=True, mesh=mesh)
  except inference.TextError as e:
    raise UsageError(f'Line {e.index + 1} of --input_file '
                     f'{args.input_file} {e.reason}.') from None
  write_lines(args.output_file, outputs)


def _load(workdir: str, devices: Sequence[jax.Device] | None = None):
  """(model, tokenizer, stream, mesh): the checkpoint sharded over this
  host's devices (or ``devices``) as ``restore.inference_mesh`` chooses,
  which decoding then shards each batch over; stream if an LM saw raw token
  windows."""
  from jax_transformer.workdirs import restore  # pylint: disable=g-import-not-at-top
  trained = restore.load_model(workdir, devices=devices)
  return trained.model, trained.tokenizer, trained.stream, trained.mesh


@cli.entry_point(PROG)
def main(argv: Sequence[str] | None = None,
         load: Callable[[str], tuple] | None = None) -> int:
  """load(workdir) -> (model, tokenizer, stream[, mesh]); tests inject one.
  """
  args = parse_args(argv)
  check_args(args)
  # Local or gs://, as training accepts it (an unreachable scheme or bucket
  # is refused at once); checked before any file is read or checkpoint
  # restored.
  storage.check_reachable(args.workdir)
  if not resolve(args.workdir).root.is_dir():
    raise UsageError(f'--workdir {args.workdir} is not a directory; give a '
                     'training workdir.')
  if args.input_file is not None:
    # Before loading: a bad file costs no checkpoint restore.
    lines = read_lines(args.input_file)
  model, tokenizer, stream, mesh = (*(load or _load)(args.workdir), None)[:4]
  # Once, before decoding: each batch then reuses the converted weights.
  model = quantize.for_decoding(model, args.dtype,
                                'int8' if args.int8 else None)
  if args.chat is not None:
    print(answer_chat(model, tokenizer, args, mesh))
  elif args.input is not None:
    print(run(model, tokenizer, args, stream, mesh))
  else:
    translate_file(model, tokenizer, lines, args, stream, mesh)
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
