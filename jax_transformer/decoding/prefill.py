"""The prompt's pass: an empty cache (the source encoded once for an
encoder-decoder), then the whole prompt in one ``model.extend``."""

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


def prefill(model: Model, inputs: Inputs, cache_len: int, mesh):
  """Runs the whole prompt at once: (logits after its last real token
  [B, V] float32, cache). The head runs at that one position per row."""
  cache = constrain(start(model, inputs, cache_len), mesh)
  t = inputs.prompt.shape[1]
  # The last True of each mask row (any padding pattern).
  last = t - 1 - jnp.argmax(inputs.prompt_mask[:, ::-1], axis=1)
  logits, cache = model.extend(inputs.prompt, cache, inputs.prompt_mask,
                               logits_at=last)
  return logits[:, 0], constrain(cache, mesh)
