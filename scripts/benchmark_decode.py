"""Greedy decoding speed: KV-cached vs uncached, JAX vs PyTorch.

    python scripts/benchmark_decode.py             # the full grid (minutes)
    python scripts/benchmark_decode.py --quick     # batch 8, 64 new tokens

For the paper's base encoder-decoder (``transformer_base``) and a GPT-2
small shaped decoder LM (``gpt2_small``), both with random weights, at each
batch size and number of new tokens it times:

* ``jax_cached``: ``jax_transformer.generate`` (prefill + one token per step
  in a ``lax.while_loop``, all under one jit);
* ``jax_uncached``: the whole model re-run on the sequence every step, in a
  jitted loop over a fixed-size buffer (one compilation; every step costs
  the same, so timing ``--uncached_steps`` of them gives the loop's rate);
* ``torch_uncached``: a PyTorch greedy loop re-running the model on the
  growing sequence (``torch_reference.TorchTransformer`` with the same
  weights via ``torch_compat.encoder_decoder_to_torch``; Hugging Face
  ``GPT2LMHeadModel(use_cache=False)`` via ``decoder_lm_to_gpt2``);
* ``torch_cached`` (LM only): the same GPT-2 with ``use_cache=True``.

Rates are generated tokens per second over the whole batch (B * N / time,
best of ``--repeats`` runs, at most 2 for the slow uncached loops;
compilation and warm-up excluded). EOS is ignored so every run makes exactly N tokens.
``torch_uncached`` grows quadratically and is skipped beyond
``--torch_uncached_max_tokens``. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

try:
  import jax_transformer  # noqa: F401
except ImportError:  # Run from a checkout without installing the package.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))))

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_transformer as jt
from jax_transformer import torch_compat

BOS = 1


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--quick', action='store_true',
                 help='batch 8, 64 new tokens, fewer uncached steps')
  p.add_argument('--models', default='transformer_base,gpt2_small')
  p.add_argument('--batch_sizes', default='1,8')
  p.add_argument('--new_tokens', default='64,256')
  p.add_argument('--prompt_len', type=int, default=16,
                 help='source length (encoder-decoder) or prompt length (LM)')
  p.add_argument('--repeats', type=int, default=3,
                 help='timed runs, best kept (uncached loops: at most 2)')
  p.add_argument('--uncached_steps', type=int, default=8,
                 help='steps timed for jax_uncached (constant cost/step)')
  p.add_argument('--torch_uncached_max_tokens', type=int, default=64,
                 help='skip the (quadratic) torch_uncached loop beyond this')
  p.add_argument('--no_torch', action='store_true')
  p.add_argument('--output', help='also write the JSON here')
  args = p.parse_args(argv)
  if args.quick:
    args.batch_sizes, args.new_tokens = '8', '64'
    args.uncached_steps = 4
  return args


def best_time(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


# ----------------------------------------------------------------------------
# JAX.


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _uncached(graphdef, state, buf, start, steps, src):
  """Greedy: re-run the full model on buf [B, L] for `steps` steps.

  Tokens sit in buf[:, :start]; step i writes slot start + i. The causal
  mask hides the empty slots after, so one buffer size serves every step.
  """
  model = nnx.merge(graphdef, state)

  def step(i, buf):
    logits = model(buf) if src is None else model(src, buf)
    pos = start + i
    nxt = jnp.argmax(logits[:, pos - 1], axis=-1).astype(buf.dtype)
    return jax.lax.dynamic_update_slice_in_dim(buf, nxt[:, None], pos, 1)

  return jax.lax.fori_loop(0, steps, step, buf)


def jax_uncached(model, inputs, n: int, steps: int, repeats: int):
  """(tokens/s, timed steps); the loop is compiled once (warm-up: 1 step)."""
  graphdef, state = nnx.split(model)
  src = inputs.get('src_ids')
  prompt = inputs.get('prompt_ids')
  if prompt is None:
    prompt = np.full((src.shape[0], 1), BOS, np.int32)
  b, t = prompt.shape
  buf = jnp.asarray(np.concatenate([prompt, np.zeros((b, n), np.int32)], 1))
  src = None if src is None else jnp.asarray(src)
  steps = min(steps, n)
  run = lambda k: _uncached(graphdef, state, buf, t, k, src)  # noqa: E731
  run(1).block_until_ready()
  elapsed = best_time(lambda: run(steps).block_until_ready(), repeats)
  return b * steps / elapsed, steps


def jax_cached(model, inputs, n: int, repeats: int):
  """(tokens/s, compile seconds, tokens) of jax_transformer.generate."""
  call = lambda: jt.generate(model, **inputs, max_new_tokens=n,  # noqa: E731
                             eos_id=None).tokens.block_until_ready()
  start = time.perf_counter()
  tokens = call()
  first = time.perf_counter() - start
  elapsed = best_time(call, repeats)
  b = next(iter(inputs.values())).shape[0]
  return b * n / elapsed, max(first - elapsed, 0.0), np.asarray(tokens)


# ----------------------------------------------------------------------------
# PyTorch.


def torch_encoder_decoder(model, config):
  import torch

  from jax_transformer.torch_reference import TorchTransformer
  ref = TorchTransformer.from_config(config)
  ref.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in
                       torch_compat.encoder_decoder_to_torch(model).items()})
  return ref.eval()


def torch_gpt2(model, config):
  import torch
  import transformers
  hf_config = transformers.GPT2Config(
      vocab_size=config.vocab_size, n_positions=config.max_len,
      n_embd=config.d_model, n_layer=config.num_decoder_layers,
      n_head=config.num_heads, n_inner=config.d_ff,
      activation_function='gelu_new', resid_pdrop=0.0, embd_pdrop=0.0,
      attn_pdrop=0.0, layer_norm_epsilon=config.layer_norm_eps)
  hf = transformers.GPT2LMHeadModel(hf_config)
  state = {k: torch.from_numpy(np.array(v)) for k, v in
           torch_compat.decoder_lm_to_gpt2(model).items()}
  hf.load_state_dict(state, strict=False)  # buffers (attn.bias) stay
  return hf.eval()


def torch_greedy(ref, inputs, n: int, use_cache: bool | None):
  """Greedy loop; use_cache None: the reference encoder-decoder."""
  import torch
  with torch.inference_mode():
    if use_cache is None:
      src = torch.from_numpy(np.asarray(inputs['src_ids'])).long()
      tgt = torch.full((src.shape[0], 1), BOS, dtype=torch.long)
      for _ in range(n):
        nxt = ref(src, tgt)[:, -1].argmax(-1, keepdim=True)
        tgt = torch.cat([tgt, nxt], dim=1)
      return tgt[:, 1:].numpy()
    ids = torch.from_numpy(np.asarray(inputs['prompt_ids'])).long()
    out, past, feed = [], None, ids
    for _ in range(n):
      if use_cache:
        result = ref(feed, cache=past, use_cache=True)
        past = result.cache
      else:
        result = ref(ids, use_cache=False)
      nxt = result.logits[:, -1].argmax(-1, keepdim=True)
      out.append(nxt)
      ids = torch.cat([ids, nxt], dim=1)
      feed = nxt
    return torch.cat(out, dim=1).numpy()


def torch_rate(ref, inputs, n, use_cache, repeats):
  torch_greedy(ref, inputs, 2, use_cache)  # warm-up
  b = next(iter(inputs.values())).shape[0]
  tokens = []
  elapsed = best_time(lambda: tokens.append(
      torch_greedy(ref, inputs, n, use_cache)), repeats)
  return b * n / elapsed, tokens[-1]


# ----------------------------------------------------------------------------


def build(name: str):
  config = jt.PRESETS[name](dropout_rate=0.0, attention_dropout_rate=0.0)
  cls = jt.DecoderLM if config.num_encoder_layers == 0 else jt.EncoderDecoder
  return cls(config, nnx.Rngs(0)), config


def bench_model(name: str, args) -> list[dict]:
  model, config = build(name)
  is_lm = isinstance(model, jt.DecoderLM)
  ref = None
  if not args.no_torch:
    ref = (torch_gpt2 if is_lm else torch_encoder_decoder)(model, config)
  results = []
  rs = np.random.RandomState(0)
  for b in [int(x) for x in args.batch_sizes.split(',')]:
    ids = rs.randint(3, config.vocab_size, (b, args.prompt_len)).astype(
        np.int32)
    inputs = {'prompt_ids' if is_lm else 'src_ids': ids}
    for n in [int(x) for x in args.new_tokens.split(',')]:
      row = dict(model=name, batch=b, new_tokens=n,
                 prompt_len=args.prompt_len)
      row['jax_cached'], row['jax_compile_s'], tokens = jax_cached(
          model, inputs, n, args.repeats)
      row['jax_uncached'], row['jax_uncached_timed_steps'] = jax_uncached(
          model, inputs, n, args.uncached_steps, min(args.repeats, 2))
      row['cached_vs_uncached'] = row['jax_cached'] / row['jax_uncached']
      if ref is not None:
        if n <= args.torch_uncached_max_tokens:
          rate, want = torch_rate(ref, inputs, n, False if is_lm else None,
                                  min(args.repeats, 2))
          row['torch_uncached'] = rate
          row['cached_vs_torch_uncached'] = row['jax_cached'] / rate
          # Random weights and float32: near-ties may flip a late token.
          row['same_tokens_as_torch'] = float((want == tokens).mean())
        if is_lm:
          rate, want = torch_rate(ref, inputs, n, True, args.repeats)
          row['torch_cached'] = rate
          row['cached_vs_torch_cached'] = row['jax_cached'] / rate
          row.setdefault('same_tokens_as_torch',
                         float((want == tokens).mean()))
      results.append({k: round(v, 3) if isinstance(v, float) else v
                      for k, v in row.items()})
      print(json.dumps(results[-1]), file=sys.stderr, flush=True)
  return results


def main(argv=None) -> int:
  args = parse_args(argv)
  report = {
      'command': 'python scripts/benchmark_decode.py ' + ' '.join(
          sys.argv[1:] if argv is None else argv),
      'machine': dict(platform=jax.devices()[0].platform,
                      device=jax.devices()[0].device_kind,
                      cpus=os.cpu_count(), processor=platform.processor(),
                      jax=jax.__version__),
      'units': 'generated tokens per second (whole batch); ratios are '
               'jax_cached / baseline',
      'results': [r for name in args.models.split(',')
                  for r in bench_model(name, args)],
  }
  text = json.dumps(report, indent=1)
  print(text)
  if args.output:
    with open(args.output, 'w') as f:
      f.write(text + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
