"""The public entry points: ``generate`` and ``beam_search``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_transformer.decoding import quantize
from jax_transformer.decoding.beam import beam_search_jit
from jax_transformer.decoding.inputs import (
  Inputs,
  check_positive,
  check_total_length,
  place,
  place_state,
  prepare,
  resolve_mesh,
)
from jax_transformer.decoding.loop import TokenChooser, generate_jit
from jax_transformer.decoding.results import (
  EXTRA_NEW_TOKENS,
  BeamResult,
  Generation,
)
from jax_transformer.decoding.sampling import greedy, is_deterministic
from jax_transformer.errors import UsageError
from jax_transformer.model.models import DecoderLM, EncoderDecoder
from jax_transformer.reserved_ids import BOS_ID, EOS_ID, PAD_ID

Array = jax.Array
Model = EncoderDecoder | DecoderLM


def _special_ids(eos_id: int | None, pad_id: int) -> tuple[Array, Array]:
  """Traced, so other ids reuse the compiled program; no EOS is -1."""
  return (jnp.int32(-1 if eos_id is None else eos_id), jnp.int32(pad_id))


def _run(fn, model, inputs: Inputs, mesh: Mesh | None, *args, **static):
  mesh = resolve_mesh(mesh, inputs.prompt.shape[0])
  graphdef, state = nnx.split(model)
  state, inputs = place_state(state, mesh), place(inputs, mesh)
  if mesh is not None:  # e.g. the sampling key: replicated
    args = jax.device_put(args, NamedSharding(mesh, P()))
  if mesh is None:
    return fn(graphdef, state, inputs, *args, mesh=None, **static)
  with jax.set_mesh(mesh):
    return fn(graphdef, state, inputs, *args, mesh=mesh, **static)


def generate(model: Model, prompt_ids: Any = None, prompt_mask: Any = None,
             *, max_new_tokens: int, src_ids: Any = None,
             src_mask: Any = None, sampler: TokenChooser = greedy,
             key: Array | None = None, eos_id: int | None = EOS_ID,
             pad_id: int = PAD_ID, bos_id: int = BOS_ID,
             mesh: Mesh | None = None, dtype: str | None = None,
             weights: str | None = None,
             prefill_chunk: int | None = None) -> Generation:
  """Generates up to ``max_new_tokens`` per sequence with a KV cache.

  model: a DecoderLM (continues ``prompt_ids``) or an EncoderDecoder
    (translates ``src_ids``, its decoder starting from ``prompt_ids`` if
    given, else from ``bos_id``).
  prompt_ids, prompt_mask: [B, T] ids and bool mask (True = real token;
    default ``prompt_ids != pad_id``). Rows may have different lengths.
  src_ids, src_mask: [B, S], EncoderDecoder only; mask as above.
  sampler: ``(logits [B, V], key) -> ids [B]``, e.g. ``greedy`` or
    ``Sampler(temperature=0.8, top_p=0.9)``; step i uses
    ``jax.random.fold_in(key, i)``, so a key gives the same tokens.
  key: required unless the sampler is greedy.
  eos_id: a sequence stops after producing it (None: never stops early).
  mesh: shard the batch over its 'data' axis (default: the mesh set by
    ``jax.set_mesh``, if any).
  dtype, weights: decode a lower-precision copy of the model (see
    :func:`jax_transformer.decoding.quantize.for_decoding`): dtype 'bfloat16' casts
    the parameters once and computes (and caches keys/values) in bfloat16,
    logits staying float32; None keeps the model's own. weights 'int8'
    holds the matmul kernels as int8 with per-channel scales. The copy is
    made on every call: to decode often, make it once with ``for_decoding``
    and pass that model.
  prefill_chunk: a prompt longer than this many tokens is read into the
    cache a chunk at a time (memory bounded by the chunk, not the prompt;
    the same tokens); None reads it at once.

  Returns ``Generation(tokens [B, N], lengths [B])``.
  """
  n = check_positive('max_new_tokens', max_new_tokens)
  if prefill_chunk is not None:
    prefill_chunk = check_positive('prefill_chunk', prefill_chunk)
  if not callable(sampler):
    raise TypeError('sampler must be callable as sampler(logits, key), e.g. '
                    'jax_transformer.decoding.sampling.greedy or Sampler(...).')
  if key is None:
    if not is_deterministic(sampler):
      raise UsageError('Sampling needs a key, e.g. key=jax.random.key(0); '
                       'only a greedy sampler runs without one.')
    key = jax.random.key(0)
  inputs = prepare(model, prompt_ids, prompt_mask, src_ids, src_mask,
                    pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
  check_total_length(model, inputs.prompt.shape[1], n, 'max_new_tokens')
  model = quantize.for_decoding(model, dtype, weights)
  return _run(generate_jit, model, inputs, mesh, key,
              *_special_ids(eos_id, pad_id), max_new_tokens=n,
              sampler=sampler, prefill_chunk=prefill_chunk)


def beam_search(model: Model, prompt_ids: Any = None, prompt_mask: Any = None,
                *, src_ids: Any = None, src_mask: Any = None,
                beam_size: int = 4, alpha: float = 0.6,
                max_len: int | None = None, eos_id: int | None = EOS_ID,
                pad_id: int = PAD_ID, bos_id: int = BOS_ID,
                mesh: Mesh | None = None, dtype: str | None = None,
                weights: str | None = None) -> BeamResult:
  """Beam search with GNMT's length penalty, under one jit.

  Inputs as :func:`generate`. Hypotheses are ranked by
  ``log P(y) / ((5 + |y|) / 6) ** alpha`` with |y| the new tokens, EOS
  included. At each step the 2K best extensions are considered: those among
  the best K ending in EOS are finished, the K best others live on; a
  sequence stops when no live beam can beat its K finished hypotheses (its
  best log-probability over the length penalty at ``max_len`` is at most
  the worst finished score), or after ``max_len`` new tokens (live
  hypotheses are then finished as they are). With ``beam_size=1`` this is
  greedy decoding.

  max_len: most new tokens per hypothesis; default the input length
    (source for an EncoderDecoder, prompt for a DecoderLM, padded) + 50,
    capped by the model's max_len for learned positions.
  dtype, weights: as :func:`generate`.

  Returns ``BeamResult(tokens [B, max_len], scores [B], lengths [B])``.
  """
  k = check_positive('beam_size', beam_size)
  if (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
      or not alpha >= 0):
    raise UsageError(f'alpha must be a number >= 0, got {alpha!r}.')
  inputs = prepare(model, prompt_ids, prompt_mask, src_ids, src_mask,
                    pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
  t = inputs.prompt.shape[1]
  if max_len is None:
    source = inputs.src if inputs.src is not None else inputs.prompt
    max_len = source.shape[1] + EXTRA_NEW_TOKENS
    if model.config.positional == 'learned':
      max_len = min(max_len, model.config.max_len - t)
      if max_len < 1:
        raise UsageError(f'The prompt (padded to {t} tokens) leaves no room '
                         f"under the model's max_len="
                         f'{model.config.max_len} (learned positions).')
  n = check_positive('max_len', max_len)
  check_total_length(model, t, n, 'max_len')
  model = quantize.for_decoding(model, dtype, weights)
  return _run(beam_search_jit, model, inputs, mesh,
              *_special_ids(eos_id, pad_id), beam_size=k, alpha=float(alpha),
              max_len=n)
