"""The prompt's pass: an empty cache (the source encoded once for an
encoder-decoder), then the prompt through ``model.extend``, whole or a
chunk at a time.

A prompt longer than ``chunk`` tokens goes through in chunks, as the
server prefills a long prompt (``serve.py --prefill_chunk``): each chunk's
queries attend the cache written so far, so attention's scores are
[B, N, chunk, cache] however long the prompt, where the whole prompt at
once needs [B, N, T, T] (at 32,768 tokens and 4 heads, 16 GiB in
float32). The tokens are the same either way (tests/decoding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_transformer.decoding.inputs import Inputs, constrain
from jax_transformer.model.attention import KVCache
from jax_transformer.model.families import family_of
from jax_transformer.model.models import DecoderLM, EncoderDecoder

Array = jax.Array
Model = EncoderDecoder | DecoderLM


def start(model: Model, inputs: Inputs, cache_len: int) -> KVCache:
  """An empty cache; for a model with a source side, the source encoded
  once (``Family.empty_cache``)."""
  return family_of(model).empty_cache(model, inputs.prompt.shape[0],
                                      inputs.src, inputs.src_mask, cache_len)


def chunk_padding(prompt_len: int, chunk: int | None) -> int:
  """Slots a prompt of prompt_len tokens is padded by (on the left) to
  whole chunks; 0 where it goes through at once."""
  if not chunk or prompt_len <= chunk:
    return 0
  return -prompt_len % chunk


def prefill(model: Model, inputs: Inputs, new_slots: int, mesh,
            chunk: int | None = None):
  """Runs the prompt [B, T] into a cache with new_slots slots after it:
  (logits after each row's last real token [B, V] float32, cache). The
  head runs at that one position per row. With chunk set and T longer,
  the prompt goes through chunk tokens at a time (left-padded to whole
  chunks: the cache has ``chunk_padding`` more slots)."""
  prompt, mask = inputs.prompt, inputs.prompt_mask
  pad = chunk_padding(prompt.shape[1], chunk)
  if pad:
    prompt = jnp.pad(prompt, ((0, 0), (pad, 0)))
    mask = jnp.pad(mask, ((0, 0), (pad, 0)))
  t = prompt.shape[1]
  cache = constrain(start(model, inputs, t + new_slots), mesh)
  # The last True of each mask row (any padding pattern).
  last = t - 1 - jnp.argmax(mask[:, ::-1], axis=1)
  if not chunk or t <= chunk:  # (padding is only ever for chunks)
    logits, cache = model.extend(prompt, cache, mask, logits_at=last)
    return logits[:, 0], constrain(cache, mesh)

  def one_chunk(i, carry):
    """Chunk i into the cache; a row whose last token is in it takes its
    logits from it."""
    logits, cache = carry
    begin = i * chunk
    ids = jax.lax.dynamic_slice_in_dim(prompt, begin, chunk, axis=1)
    real = jax.lax.dynamic_slice_in_dim(mask, begin, chunk, axis=1)
    out, cache = model.extend(ids, cache, real,
                              logits_at=jnp.clip(last - begin, 0, chunk - 1))
    here = (last >= begin) & (last < begin + chunk)
    logits = out[:, 0] if logits is None else jnp.where(
        here[:, None], out[:, 0], logits)
    return logits, constrain(cache, mesh)

  carry = one_chunk(0, (None, cache))
  return jax.lax.fori_loop(1, t // chunk, one_chunk, carry)
