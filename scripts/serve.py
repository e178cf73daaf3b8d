"""Serve a trained, fine-tuned or imported language model over an
OpenAI-compatible HTTP API, with continuous batching.

    python scripts/serve.py --workdir runs/lm_shakespeare
    python scripts/serve.py --workdir runs/llama --max_slots 16 \
        --max_len 2048 --dtype bfloat16 --int8 --port 8000

The workdir is anything ``generate.py`` takes: a training workdir (its
latest checkpoint), one made by ``import_params.py``, a LoRA run, a
Hugging Face folder, or ``gs://``; its parameters are spread over this
host's devices as the sharded restore spreads them, and the decode slots
over the mesh's 'data' axis. Every program is compiled before the server
listens (the count and time are printed), so the first request waits for
no compile.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /health``; ``docs/serving.md`` has a client
example. ``--api_key`` (or ``$JAX_TRANSFORMER_API_KEY``) makes every
``/v1/`` request carry ``Authorization: Bearer KEY``. SIGTERM (or Ctrl-C)
stops accepting, lets the answers in flight finish for up to
``--shutdown_timeout`` seconds, cuts the rest, and exits 0.

Bad flags or a workdir that cannot be served are one sentence on stderr
and exit code 2, before the checkpoint is read where possible.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import sys
import time
from typing import Sequence

from jax_transformer import cli
from jax_transformer.decoding import quantize
from jax_transformer.errors import UsageError
from jax_transformer.runtime import storage
from jax_transformer.runtime.workdir import resolve

PROG = 'serve.py'
KEY_VARIABLE = 'JAX_TRANSFORMER_API_KEY'


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = cli.ArgumentParser(
      prog=PROG, description='Serve a language model over an '
                             'OpenAI-compatible API with continuous '
                             'batching.')
  p.add_argument('--workdir', required=True,
                 help='a training, import_params.py or LoRA workdir, a '
                      'Hugging Face folder, or gs://')
  p.add_argument('--host', default='127.0.0.1',
                 help='address to listen on (0.0.0.0: every interface)')
  p.add_argument('--port', type=int, default=8000, help='port to listen on')
  p.add_argument('--max_slots', type=int, default=8,
                 help='requests decoded at once (one KV-cache row each)')
  p.add_argument('--max_len', type=int, default=None,
                 help="tokens a request may hold, prompt and answer "
                      "(default: the model's max_len, at most 4096)")
  p.add_argument('--prefill_chunk', type=int, default=256,
                 help='longest prompt piece prefilled at once; longer '
                      'prompts join in several')
  p.add_argument('--max_queue', type=int, default=256,
                 help='requests that may wait for a slot; more get 429')
  p.add_argument('--dtype', choices=quantize.DTYPES, default=None,
                 help="compute dtype (default: the checkpoint's)")
  p.add_argument('--int8', action='store_true',
                 help='int8 weight-only matmul kernels')
  p.add_argument('--model_name', default=None,
                 help="the model id clients send (default: the workdir's "
                      'name)')
  p.add_argument('--api_key', default=None,
                 help=f'require this bearer token (default: ${KEY_VARIABLE} '
                      'if set)')
  p.add_argument('--shutdown_timeout', type=float, default=30.0,
                 help='seconds answers in flight may take after SIGTERM')
  return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
  """Raises UsageError for bad flags, before anything is read."""
  for flag, least in (('max_slots', 1), ('prefill_chunk', 16),
                      ('max_queue', 1), ('port', 0)):
    if getattr(args, flag) < least:
      raise UsageError(f'--{flag} must be at least {least}, got '
                       f'{getattr(args, flag)}.')
  if args.port > 65535:
    raise UsageError(f'--port must be at most 65535, got {args.port}.')
  if args.max_len is not None and args.max_len < 2:
    raise UsageError(f'--max_len must be at least 2, got {args.max_len}.')
  if args.shutdown_timeout < 0:
    raise UsageError('--shutdown_timeout must be >= 0, got '
                     f'{args.shutdown_timeout}.')
  storage.check_reachable(args.workdir)  # a gs:// bucket answers, at once
  if not resolve(args.workdir).root.is_dir():
    raise UsageError(f'--workdir {args.workdir} is not a directory; give a '
                     'training workdir or a Hugging Face folder.')


def model_name(args: argparse.Namespace) -> str:
  return args.model_name or pathlib.PurePosixPath(
      args.workdir.rstrip('/')).name or 'model'


def build(args: argparse.Namespace):
  """(Served, seconds spent compiling, program count): the model loaded,
  its engine compiled and started."""
  from jax_transformer.model.families import family_of  # pylint: disable=g-import-not-at-top
  from jax_transformer.serving.api import Served  # pylint: disable=g-import-not-at-top
  from jax_transformer.serving.engine import Engine  # pylint: disable=g-import-not-at-top
  from jax_transformer.workdirs import restore  # pylint: disable=g-import-not-at-top
  trained = restore.load_model(args.workdir)
  if family_of(trained.model).has_source:
    raise UsageError(f'--workdir {args.workdir} holds an encoder-decoder; '
                     'the server answers with a decoder-only language '
                     'model (translate with generate.py).')
  max_len = args.max_len or min(trained.model.config.max_len, 4096)
  model = quantize.for_decoding(trained.model, args.dtype,
                                'int8' if args.int8 else None)
  engine = Engine(model, slots=args.max_slots, max_len=max_len,
                  chunk=args.prefill_chunk, queue=args.max_queue,
                  mesh=trained.mesh)
  count, seconds = engine.compile()
  served = Served(engine=engine, tokenizer=trained.tokenizer, model=model,
                  name=model_name(args), stream=trained.stream,
                  api_key=args.api_key or os.environ.get(KEY_VARIABLE))
  engine.start()
  return served, count, seconds


def run_server(served, args: argparse.Namespace) -> None:
  """Serves until SIGTERM or SIGINT; the engine stops with the server."""
  import uvicorn  # pylint: disable=g-import-not-at-top

  from jax_transformer.serving.api import create_app  # pylint: disable=g-import-not-at-top

  class Server(uvicorn.Server):
    def handle_exit(self, sig, frame):
      served.engine.close()  # new requests get 503 from now on
      super().handle_exit(sig, frame)

  config = uvicorn.Config(create_app(served), host=args.host, port=args.port,
                          log_level='warning', access_log=False,
                          timeout_graceful_shutdown=args.shutdown_timeout)
  # uvicorn re-raises the signal it caught once it has shut down: to the
  # handlers set here, which let the process return 0.
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: None)
  try:
    Server(config).run()
  finally:
    served.engine.stop()


@cli.entry_point(PROG)
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  check_args(args)
  start = time.perf_counter()
  served, count, seconds = build(args)
  engine = served.engine
  more = ', the next chunk of a longer prompt' if engine.chunked else ''
  print(f'Loaded {args.workdir} and compiled {count} programs in '
        f'{seconds:.1f} s ({len(engine.buckets)} prompt widths up to '
        f'{engine.chunk} tokens{more}; per cache of '
        f'{engine.capacities[0]} to {engine.slots} rows: its decode step, '
        f'writes and resizes); {engine.slots} slots of {engine.max_len} '
        f'tokens.',
        flush=True)
  print(f'Serving {served.name} on http://{args.host}:{args.port}/v1 '
        f'({time.perf_counter() - start:.1f} s after start-up began).',
        flush=True)
  run_server(served, args)
  print('Stopped.', flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
