"""Greedy decoding against the decoders people use, interleaved in one run.

For a GPT-2-small-shaped LM: ``jax_transformer.generate`` against Hugging
Face ``GPT2LMHeadModel.generate`` (its KV cache, greedy) on the same
weights; for the paper's base encoder-decoder: against a PyTorch greedy loop
over the reference ``nn.Transformer`` module (which has no KV cache). Each
round times every side once, alternating order (``timing.interleave``).

Decoding one token reads every weight once and the cache so far: at batch 1
it is bound by memory bandwidth. So each row also gives the bytes a step
reads and the bandwidth that implies, against the host's (or device's)
bandwidth measured in the same run, and against a stated peak (an H200's
4.8 TB/s) on a GPU.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_transformer.bench import timing
from jax_transformer.decoding import generate
from jax_transformer.interop import torch_compat
from jax_transformer.model.config import gpt2_small, transformer_base
from jax_transformer.model.models import DecoderLM, EncoderDecoder

BOS = 1
# Vendor peak memory bandwidth, bytes/s, by device kind (substring).
PEAK_BANDWIDTH = {'H200': 4.8e12, 'H100': 3.35e12, 'A100': 2.0e12}


def measured_bandwidth(megabytes: int = 256, rounds: int = 5) -> float:
  """Bytes/s this device streams a weight matrix through a matrix-vector
  product (a batch-1 decoding step's access pattern): the median time of
  a float32 [n, n] matrix of ``megabytes`` times a vector."""
  n = int((megabytes * 2 ** 20 / 4) ** 0.5)
  w = jnp.ones((n, n), jnp.float32)
  x = jnp.ones((n, 1), jnp.float32)
  product = jax.jit(jnp.matmul)
  product(w, x).block_until_ready()
  times = [timing.timed(lambda: product(w, x).block_until_ready())
           for _ in range(rounds)]
  return w.nbytes / statistics.median(times)


def peak_bandwidth(device_kind: str) -> float | None:
  for name, value in PEAK_BANDWIDTH.items():
    if name in device_kind:
      return value
  return None


def step_bytes(model: nnx.Module, batch: int, cache_len: float,
               weight_bytes: float | None = None) -> float:
  """Bytes one decoding step reads: every weight once (an embedding
  table's lookup reads B rows, but a tied head reads it all) and the
  keys and values of cache_len slots per layer. weight_bytes overrides the
  weights' size (e.g. for int8 weights)."""
  c = model.config
  if weight_bytes is None:
    weight_bytes = sum(x.nbytes for x in
                       jax.tree.leaves(nnx.state(model, nnx.Param)))
  cache = (2 * c.num_decoder_layers * batch * c.kv_heads * c.head_dim
           * cache_len * jnp.dtype(c.compute_dtype).itemsize)
  return weight_bytes + cache


@dataclasses.dataclass
class Case:
  """One model, batch and length: its contenders and what a step reads."""
  name: str
  batch: int
  new_tokens: int
  prompt_len: int
  contenders: dict[str, Callable[[], np.ndarray]]
  bytes_per_step: dict[str, float]
  reference: str


def _jax_side(model, inputs, n, **options) -> Callable[[], np.ndarray]:
  def run():
    out = generate(model, **inputs, max_new_tokens=n, eos_id=None,
                      **options)
    return np.asarray(out.tokens)
  return run


def _hf_gpt2(model):
  import torch  # optional (the test extra): only PyTorch paths need it
  import transformers  # optional (the test extra), heavy
  c = model.config
  hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model,
      n_layer=c.num_decoder_layers, n_head=c.num_heads, n_inner=c.d_ff,
      activation_function='gelu_new', resid_pdrop=0.0, embd_pdrop=0.0,
      attn_pdrop=0.0, layer_norm_epsilon=c.layer_norm_eps))
  state = {k: torch.from_numpy(np.array(v)) for k, v in
           torch_compat.decoder_lm_to_gpt2(model).items()}
  hf.load_state_dict(state, strict=False)  # buffers (attn.bias) stay
  return hf.eval()


def _hf_side(hf, prompt: np.ndarray, n: int) -> Callable[[], np.ndarray]:
  import torch  # optional (the test extra): only PyTorch paths need it
  ids = torch.from_numpy(prompt).long()

  def run():
    with torch.inference_mode():
      out = hf.generate(ids, attention_mask=torch.ones_like(ids),
                        max_new_tokens=n, min_new_tokens=n, do_sample=False,
                        num_beams=1, use_cache=True, pad_token_id=0)
    return out[:, ids.shape[1]:].numpy()
  return run


def _torch_reference_side(model, src: np.ndarray,
                          n: int) -> Callable[[], np.ndarray]:
  import torch  # optional (the test extra): only PyTorch paths need it

  # It imports torch, optional (the test extra).
  from jax_transformer.interop.torch_reference import TorchTransformer
  ref = TorchTransformer.from_config(model.config)
  ref.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in
                       torch_compat.encoder_decoder_to_torch(model).items()})
  ref.eval()
  source = torch.from_numpy(src).long()

  def run():
    with torch.inference_mode():
      tgt = torch.full((source.shape[0], 1), BOS, dtype=torch.long)
      for _ in range(n):
        nxt = ref(source, tgt)[:, -1].argmax(-1, keepdim=True)
        tgt = torch.cat([tgt, nxt], dim=1)
    return tgt[:, 1:].numpy()
  return run


def lm_case(batch: int, new_tokens: int, prompt_len: int,
            options: dict[str, dict], torch_side: bool = True) -> Case:
  """GPT-2 small's shape, random weights: each of ``options`` (name ->
  generate keyword arguments) against HF generate."""
  model = DecoderLM(gpt2_small(dropout_rate=0.0,
                                     attention_dropout_rate=0.0),
                       nnx.Rngs(0))
  prompt = np.random.RandomState(0).randint(
      3, model.config.vocab_size, (batch, prompt_len)).astype(np.int32)
  inputs = {'prompt_ids': prompt}
  contenders = {name: _jax_side(model, inputs, new_tokens, **kw)
                for name, kw in options.items()}
  if torch_side:
    contenders['hf'] = _hf_side(_hf_gpt2(model), prompt, new_tokens)
  cache_len = prompt_len + new_tokens / 2
  per_step = {name: step_bytes(model, batch, cache_len)
              for name in contenders}
  return Case('gpt2_small', batch, new_tokens, prompt_len, contenders,
              per_step, 'hf')


def encoder_decoder_case(batch: int, new_tokens: int, src_len: int,
                         torch_side: bool = True) -> Case:
  """The paper's base model, random weights: ours against the PyTorch
  reference module's greedy loop."""
  model = EncoderDecoder(transformer_base(
      dropout_rate=0.0, attention_dropout_rate=0.0), nnx.Rngs(0))
  src = np.random.RandomState(0).randint(
      3, model.config.vocab_size, (batch, src_len)).astype(np.int32)
  contenders = {'jax': _jax_side(model, {'src_ids': src}, new_tokens)}
  if torch_side:
    contenders['torch_reference'] = _torch_reference_side(model, src,
                                                          new_tokens)
  per_step = {name: step_bytes(model, batch, new_tokens / 2)
              for name in contenders}
  return Case('transformer_base', batch, new_tokens, src_len, contenders,
              per_step, 'torch_reference')


def measure(case: Case, rounds: int, bandwidth: float,
            peak: float | None = None) -> list[dict]:
  """Interleaved rounds of every contender; one row each."""
  outputs = {name: fn() for name, fn in case.contenders.items()}  # warm-up
  times = timing.interleave(
      {name: fn for name, fn in case.contenders.items()}, rounds, warmup=0)
  rows = []
  for name, ts in times.items():
    seconds = statistics.median(ts)
    steps = case.new_tokens
    row = dict(model=case.name, side=name, batch=case.batch,
               new_tokens=steps, prompt_len=case.prompt_len, rounds=rounds,
               seconds=seconds, tokens_per_s=case.batch * steps / seconds,
               ms_per_token=1e3 * seconds / steps,
               bytes_per_step=case.bytes_per_step[name],
               bandwidth_fraction=(case.bytes_per_step[name] * steps
                                   / seconds / bandwidth),
               measured_bandwidth_gb_s=bandwidth / 1e9)
    if peak:
      row['peak_bandwidth_fraction'] = (case.bytes_per_step[name] * steps
                                        / seconds / peak)
    if case.reference in times and name != case.reference:
      ratios = [r / o for o, r in zip(ts, times[case.reference])]
      key = f'speed_vs_{case.reference}'
      row.update({key: statistics.median(ratios), f'{key}_min': min(ratios),
                  f'{key}_max': max(ratios)})
      row['same_tokens'] = float(
          (outputs[name] == outputs[case.reference]).mean())
    rows.append(row)
  return rows
