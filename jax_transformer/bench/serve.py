"""The server against transformers' continuous batching, one client
process, the same checkpoint, cores, prompts and answer lengths.

The checkpoint is GPT-2 small's shape at random weights with a BPE trained
here (``harness.make_checkpoint``), its tokenizer padded with plain tokens
to the model's 50,257 ids (so that every token the model draws is text a
stream carries) and no EOS in its generation config (every answer runs to
its ``max_tokens``; this server is asked with ``ignore_eos``). Both
servers run at once, each started as its user starts it: ``scripts/
serve.py --workdir FOLDER`` and ``transformers serve --continuous-batching
FOLDER``, each given room for 32 requests of 256 tokens.

For each number of concurrent clients (1, 8, 32), each round sends the
same fixed mix of prompt and answer lengths (:data:`MIX`) to each server,
in alternating order, the other server stopped (SIGSTOP) meanwhile (an
idle server that polls would take CPU from the one measured); every
client streams (server-sent events) one request after another until the
round's requests are done. Per server:
output tokens per second of wall time, time to first token (p50, p99) and
time per output token (median over requests, the first token excluded).
The row for 1 client also gives the decoding rate as a fraction of the
fp32 weight-streaming rate this host measures (``decode.measured_bandwidth``:
a step reads every weight and the cache).

Needs the test extra (PyTorch, transformers) and the serve extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import jax
import openai
from flax import nnx

from jax_transformer.bench import decode, timing
from jax_transformer.bench.harness import VOCAB, make_checkpoint
from jax_transformer.bench.restart import _port
from jax_transformer.data import shakespeare
from jax_transformer.model.config import gpt2_small
from jax_transformer.model.models import DecoderLM

# (prompt tokens, answer tokens), sent in this order and repeated.
MIX = ((32, 64), (128, 32), (8, 128), (64, 64))
CLIENTS = (1, 8, 32)
MAX_LEN = 256
GOAL_THROUGHPUT = 2.0   # ours / theirs at 32 clients, at least
GOAL_STREAMING = 0.9    # 1 client's rate / weight streaming, at least
SCRIPTS = os.path.join(os.path.dirname(__file__), '..', '..', 'scripts')


def requests_for(clients: int) -> int:
  """Requests a round sends: two per client, at least the whole mix."""
  return max(len(MIX), 2 * clients)


def make_folder(folder: str) -> str:
  """The checkpoint, its tokenizer padded to the model's vocabulary, its
  generation config without EOS."""
  import transformers  # noqa: PLC0415 (the test extra)
  make_checkpoint(folder)
  tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
  tokenizer.add_tokens([f' <t{i}>' for i in range(len(tokenizer), VOCAB)])
  tokenizer.save_pretrained(folder)
  with open(os.path.join(folder, 'generation_config.json'), 'w') as f:
    json.dump({'bos_token_id': 0, 'eos_token_id': None,
               'do_sample': False}, f)
  return folder


def prompt_of(tokenizer, text: str, length: int) -> str:
  """A piece of text that encodes to about ``length`` tokens."""
  ids = tokenizer.encode(text)[:length]
  return tokenizer.decode(ids)


class Server:
  """A server process and how a request names its model."""

  def __init__(self, name: str, command: list[str], port: int, model: str,
               extra: dict, env: dict | None = None):
    self.name, self.port, self.model, self.extra = name, port, model, extra
    self.log = tempfile.NamedTemporaryFile('w+', prefix=f'serve_{name}_',
                                           suffix='.log', delete=False)
    self.proc = subprocess.Popen(command, stdout=self.log,
                                 stderr=subprocess.STDOUT,
                                 env={**os.environ, **(env or {})},
                                 start_new_session=True)
    self.started = time.perf_counter()

  def wait_healthy(self, timeout: float = 900) -> float:
    """Seconds from start until /health answers 200."""
    deadline = time.monotonic() + timeout
    while True:
      if self.proc.poll() is not None:
        self.log.seek(0)
        raise RuntimeError(f'{self.name} server exited: '
                           f'{self.log.read()[-3000:]}')
      try:
        with urllib.request.urlopen(
            f'http://127.0.0.1:{self.port}/health', timeout=5) as r:
          if r.status == 200:
            return time.perf_counter() - self.started
      except OSError:
        pass
      if time.monotonic() > deadline:
        raise RuntimeError(f'{self.name} server not healthy in {timeout} s')
      time.sleep(1)

  @contextlib.contextmanager
  def paused(self):
    """The server's processes stopped (SIGSTOP) for the block, so that an
    idle server's own polling takes no CPU from the one measured."""
    os.killpg(self.proc.pid, signal.SIGSTOP)
    try:
      yield
    finally:
      os.killpg(self.proc.pid, signal.SIGCONT)

  def stop(self) -> None:
    self.proc.terminate()
    try:
      self.proc.wait(60)
    except subprocess.TimeoutExpired:
      self.proc.kill()


def servers(folder: str, ports: tuple[int, int]) -> dict[str, Server]:
  ours = Server('ours', [
      sys.executable, os.path.join(SCRIPTS, 'serve.py'), '--workdir', folder,
      '--port', str(ports[0]), '--max_slots', str(max(CLIENTS)),
      '--max_len', str(MAX_LEN), '--model_name', 'bench'], ports[0],
      'bench', {'ignore_eos': True})
  # Blocks of 256 tokens: one per request at 32 clients, and a spare half.
  theirs = Server('transformers', [
      'transformers', 'serve', '--continuous-batching', '--device', 'cpu',
      '--host', '127.0.0.1', '--port', str(ports[1]),
      '--max-model-len', str(MAX_LEN), '--cb-num-blocks', '48',
      '--cb-max-batch-tokens', '1024', folder], ports[1], folder, {},
      env={'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1'})
  return {'ours': ours, 'transformers': theirs}


async def _one(client, server: Server, prompt: str, tokens: int) -> dict:
  """One streamed request: time to first token, time per later token."""
  start = time.perf_counter()
  first = last = None
  stream = await client.completions.create(
      model=server.model, prompt=prompt, max_tokens=tokens, temperature=0,
      stream=True, stream_options={'include_usage': True},
      extra_body=server.extra)
  count = 0
  async for chunk in stream:
    if chunk.choices and chunk.choices[0].text:
      last = time.perf_counter()
      first = first or last
    if chunk.usage is not None:
      count = chunk.usage.completion_tokens
  return {'ttft': first - start, 'tokens': count,
          'tpot': (last - first) / (count - 1) if count > 1 else None}


async def _load(server: Server, work: list[tuple[str, int]],
                clients: int) -> dict:
  """Every request of work, from ``clients`` concurrent clients."""
  client = openai.AsyncOpenAI(base_url=f'http://127.0.0.1:{server.port}/v1',
                              api_key='none', max_retries=0, timeout=600)
  queue = list(reversed(work))
  results = []

  async def worker():
    while queue:
      prompt, tokens = queue.pop()
      results.append(await _one(client, server, prompt, tokens))

  start = time.perf_counter()
  await asyncio.gather(*(worker() for _ in range(clients)))
  wall = time.perf_counter() - start
  await client.close()
  ttft = sorted(r['ttft'] for r in results)
  return {'wall_s': wall,
          'tokens_per_s': sum(r['tokens'] for r in results) / wall,
          'ttft_p50_s': statistics.median(ttft),
          'ttft_p99_s': ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
          'tpot_s': statistics.median(r['tpot'] for r in results
                                      if r['tpot'] is not None),
          'tokens': sum(r['tokens'] for r in results)}


def _work(tokenizer, text: str, clients: int) -> list[tuple[str, int]]:
  mix = [(prompt_of(tokenizer, text[i * 997:], p), n)
         for i, (p, n) in enumerate(MIX)]
  return [mix[i % len(mix)] for i in range(requests_for(clients))]


def _weights_streaming_fraction(tpot: float, bandwidth: float) -> float:
  """1 client's decoding rate over the fp32 weight-streaming rate: the
  bytes a step reads (GPT-2 small's weights and MAX_LEN cache slots) over
  tpot, against bandwidth."""
  model = nnx.eval_shape(lambda: DecoderLM(gpt2_small(), nnx.Rngs(0)))
  weights = sum(x.size * 4 for x in jax.tree.leaves(nnx.state(model,
                                                             nnx.Param)))
  return decode.step_bytes(model, 1, MAX_LEN, weights) / tpot / bandwidth


def run(rounds: int, clients: tuple[int, ...] = CLIENTS) -> list[dict]:
  import transformers  # noqa: PLC0415
  bandwidth = decode.measured_bandwidth()
  folder = make_folder(tempfile.mkdtemp(prefix='serve_bench_'))
  tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
  source = shakespeare.default_source_dir()
  text = open(shakespeare.play_path(source, 'hamlet'),
              encoding='utf-8').read()
  running = servers(folder, (_port(), _port()))
  try:
    started = {name: s.wait_healthy() for name, s in running.items()}
    rows = []
    for n in clients:
      work = _work(tokenizer, text, n)
      sides = {name: (lambda s=s: asyncio.run(_load(s, work, n)))
               for name, s in running.items()}
      measured = {name: [] for name in sides}
      for r in range(rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
          with contextlib.ExitStack() as others:
            for other in set(running) - {name}:
              others.enter_context(running[other].paused())
            measured[name].append(sides[name]())
      rows.append(_row(n, measured, rounds, started, bandwidth))
    return rows
  finally:
    for server in running.values():
      server.stop()


def _median(results: list[dict], key: str) -> float:
  return statistics.median(r[key] for r in results)


def _row(clients: int, measured: dict, rounds: int, started: dict,
         bandwidth: float) -> dict:
  ours, theirs = measured['ours'], measured['transformers']
  ratios = [a['tokens_per_s'] / b['tokens_per_s']
            for a, b in zip(ours, theirs)]
  row = {'suite': 'serve', 'clients': clients,
         'requests': requests_for(clients), 'mix': [list(m) for m in MIX],
         'rounds': rounds, 'throughput_ratio': statistics.median(ratios),
         'throughput_ratio_min': min(ratios),
         'throughput_ratio_max': max(ratios)}
  for name, results in (('ours', ours), ('hf', theirs)):
    for key in ('tokens_per_s', 'ttft_p50_s', 'ttft_p99_s', 'tpot_s'):
      row[f'{name}_{key}'] = _median(results, key)
  row['ours_start_s'] = started['ours']
  row['hf_start_s'] = started['transformers']
  if clients == 1:
    row['ours_weight_streaming'] = _weights_streaming_fraction(
        row['ours_tpot_s'], bandwidth)
    row['hf_weight_streaming'] = _weights_streaming_fraction(
        row['hf_tpot_s'], bandwidth)
    row['goal_weight_streaming'] = GOAL_STREAMING
  if clients == max(CLIENTS):
    row['goal_throughput_ratio'] = GOAL_THROUGHPUT
  row.update(bandwidth_gb_s=bandwidth / 1e9, cores=os.cpu_count(),
             load_average=timing.load_average())
  return row
