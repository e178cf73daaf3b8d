"""FLOP accounting, peaks and the interleaved timer of the benchmarks."""

import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from jax_transformer.bench import timing
from jax_transformer.model.config import gpt2_small, transformer_base
from jax_transformer.model.models import DecoderLM, EncoderDecoder
from jax_transformer.model.params import split
from jax_transformer.train import perf


def matmul_params(model) -> dict[str, int]:
  """Sizes of the matmul kernels by part (lookups and vectors excluded)."""
  sizes = {}
  for path, value in split(model)[1].items():
    if (value.ndim >= 2 and 'position' not in path
        and not path.endswith('bias')):
      sizes[path] = value.size
  return sizes


def test_decoder_lm_train_flops_are_6n_per_token_plus_attention():
  config = gpt2_small(vocab_size=300, d_model=64, num_heads=4,
                      num_decoder_layers=3, d_ff=96, max_len=32)
  # The tied embedding is the output head's matmul: counted once.
  n = sum(matmul_params(DecoderLM(config, nnx.Rngs(0))).values())
  b, t = 2, 32
  attention = 3 * 2 * 2 * 64 * t / 2 * config.num_decoder_layers * b * t
  want = 6 * n * b * t + attention
  got = perf.step_flops(config, b, 0, t)['train']
  assert got == pytest.approx(want, rel=1e-12)


def test_encoder_decoder_flops_count_every_kernel_once_per_token():
  config = transformer_base(vocab_size=500, d_model=32, num_heads=4,
                            num_encoder_layers=2, num_decoder_layers=3,
                            d_ff=48)
  sizes = matmul_params(EncoderDecoder(config, nnx.Rngs(0)))
  b, s, t = 3, 10, 7
  # Cross-attention keys/values run over source tokens, all else over the
  # tokens of their own stack; the head over target tokens.
  macs = 0
  for path, size in sizes.items():
    if path.startswith('encoder'):
      macs += size * s
    elif 'cross_attn.key' in path or 'cross_attn.value' in path:
      macs += size * s
    else:
      macs += size * t
  d = config.d_model
  attn = 2 * d * (2 * s * s + 3 * (t * t / 2 + t * s))
  want = 2 * b * (macs + attn)
  assert perf.forward_flops(config, b, s, t) == pytest.approx(want)


@pytest.mark.parametrize('kind, peak', [
    ('NVIDIA H100 80GB HBM3', 989e12), ('NVIDIA H200', 989e12),
    ('NVIDIA A100-SXM4-40GB', 312e12), ('TPU v4', 275e12),
    ('TPU v5 lite', 197e12), ('TPU v5p', 459e12), ('cpu', None)])
def test_peak_flops_by_device_kind(kind, peak):
  assert perf.peak_flops(kind) == peak


def test_interleave_alternates_order_and_summary_takes_medians():
  calls = []
  contenders = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
  times = timing.interleave(contenders, rounds=4, warmup=1)
  assert calls == ['a', 'b', 'a', 'b', 'b', 'a', 'a', 'b', 'b', 'a']
  assert [len(v) for v in times.values()] == [4, 4]
  out = timing.summary({'a': [1.0, 2.0, 3.0], 'b': [2.0, 2.0, 2.0]},
                       'a', 'b')
  assert out['ratio'] == 1.0 and out['a_s'] == 2.0
  assert (out['ratio_min'], out['ratio_max']) == (0.5, 1.5)


def test_matmul_rate_is_positive_and_finite():
  rate = perf.matmul_rate(n=128, repeats=2)
  assert np.isfinite(rate) and rate > 0


def test_retain_freed_memory_takes_effect_in_a_fresh_process():
  code = ('from jax_transformer.runtime import host_memory; '
          'print(host_memory.retain_freed_memory())')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, check=True).stdout.strip()
  assert out == ('True' if sys.platform.startswith('linux') else 'False')
