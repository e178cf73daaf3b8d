"""Throughput accounting: floating-point work per step, known peaks, MFU.

Convention (as in the PaLM paper's MFU): count the matmuls of the model,
2 FLOPs per multiply-add, forward only; a training step is 3x the forward
(the backward costs two forwards). That is 6 N per trained token for N
matmul parameters (the output head included, lookups excluded), plus
attention's two matmuls (scores q k^T and the weighted sum of values),
4 x keys x d_model per query token per layer forward, with causal
self-attention counted as half its keys. Elementwise work (norms, softmax,
dropout, the optimizer) is not counted: it is overhead, not model work.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from jax_transformer.model.config import ModelConfig

# Dense bf16 matmul peaks per chip, FLOP/s (vendor figures, no sparsity).
PEAK_FLOPS = {
    'h100': 989e12, 'h200': 989e12, 'h800': 989e12, 'gh200': 989e12,
    'a100': 312e12, 'a800': 312e12, 'l4': 121e12,
    'tpu v4': 275e12, 'tpu v5 lite': 197e12, 'tpu v5e': 197e12,
    'tpu v5p': 459e12, 'tpu v5': 459e12, 'tpu v6 lite': 918e12,
    'tpu v6e': 918e12,
}


def peak_flops(device_kind: str) -> float | None:
  """The built-in bf16 peak of a device kind (``jax.devices()[0].device_kind``),
  e.g. 'NVIDIA H100 80GB HBM3' or 'TPU v4'; None when unknown (CPUs)."""
  kind = device_kind.lower()
  # Longest names first, so 'tpu v5 lite' wins over 'tpu v5'.
  for name in sorted(PEAK_FLOPS, key=len, reverse=True):
    if name in kind:
      return PEAK_FLOPS[name]
  return None


def _layer_macs(c: ModelConfig, cross: bool) -> dict[str, int]:
  """Multiply-adds per token of one layer's projections and feed-forward."""
  d, h = c.d_model, c.head_dim
  q_and_out = 2 * d * c.num_heads * h
  kv = 2 * d * c.kv_heads * h
  ff = (3 if c.activation == 'swiglu' else 2) * d * c.d_ff
  per_query = q_and_out + kv + ff + (q_and_out if cross else 0)
  return {'query': per_query, 'memory': kv if cross else 0}


def forward_flops(c: ModelConfig, batch: int, src_len: int,
                  tgt_len: int) -> float:
  """Forward FLOPs of one batch of ``batch`` rows of ``src_len`` source
  (0 for a decoder LM) and ``tgt_len`` target tokens (see the module
  docstring for what is counted)."""
  d = c.d_model
  enc = _layer_macs(c, cross=False)['query'] * c.num_encoder_layers * src_len
  dec_layer = _layer_macs(c, cross=src_len > 0)
  dec = c.num_decoder_layers * (dec_layer['query'] * tgt_len
                                + dec_layer['memory'] * src_len)
  head = d * c.vocab_size * tgt_len
  return 2.0 * batch * (enc + dec + head) + attention_flops(
      c, batch, src_len, tgt_len)


def attention_flops(c: ModelConfig, batch: int, src_len: int,
                    tgt_len: int) -> float:
  """Forward FLOPs of attention's scores and weighted values: 2 matmuls of
  keys x (N x H) per query, causal self-attention counted at half its
  keys."""
  width = c.num_heads * c.head_dim
  macs = 2 * width * (c.num_encoder_layers * src_len * src_len
                      + c.num_decoder_layers * (tgt_len * tgt_len / 2
                                                + tgt_len * src_len))
  return 2.0 * batch * macs


def step_flops(c: ModelConfig, batch: int, src_len: int,
               tgt_len: int) -> dict[str, float]:
  """{'forward': ..., 'train': 3 x forward} FLOPs of one batch."""
  fwd = forward_flops(c, batch, src_len, tgt_len)
  return {'forward': fwd, 'train': 3.0 * fwd}


def compile_timed(jitted, *args):
  """(``jitted`` lowered and compiled for ``args``, seconds it took): compile
  time reported apart from step time."""
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  return compiled, time.perf_counter() - start


def matmul_rate(n: int | None = None, dtype=None, repeats: int = 5) -> float:
  """The FLOP/s of an n x n matmul on the default device, best of repeats:
  the practical ceiling a model step is measured against (float32 2048 on
  CPU, bfloat16 8192 on accelerators by default)."""
  accelerator = jax.default_backend() != 'cpu'
  n = n or (8192 if accelerator else 2048)
  dtype = dtype or (jnp.bfloat16 if accelerator else jnp.float32)
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * n ** 3 / best
