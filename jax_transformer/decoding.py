"""KV-cached decoding under one ``jax.jit``: sampling and beam search.

Both entry points work for either model type:

* ``DecoderLM``: ``prompt_ids`` [B, T] are continued.
* ``EncoderDecoder``: ``src_ids`` [B, S] go through the encoder once, the
  cross-attention keys/values are projected once into the cache, and the
  decoder starts from ``prompt_ids`` (a target prefix) or from BOS.

Prompts of different lengths share a batch: pad them (right padding is the
usual choice) and mark real tokens in ``prompt_mask`` (by default
``prompt_ids != pad_id``). The whole prompt is prefilled by one
``model.extend`` call; new tokens then come one per step inside a
``jax.lax.while_loop`` that stops early once every sequence has finished.
Each call is one jitted computation, cached by (model structure, shapes,
sampler, options): calling again with the same shapes does not recompile.

Under a mesh (``jax.set_mesh(mesh)`` or ``mesh=``) with a ``'data'`` axis,
the batch (and the cache, beams included) is sharded over ``'data'``;
parameters keep the sharding they were given.

Reserved ids follow the tokenizers: PAD 0, BOS 1, EOS 2.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_transformer.attention import KVCache
from jax_transformer.models import DecoderLM, EncoderDecoder
from jax_transformer.sampling import Sampler, greedy, is_deterministic

Array = jax.Array
Model = EncoderDecoder | DecoderLM
TokenChooser = Callable[[Array, Array], Array]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
# The default length limit: input length + this many new tokens (the paper's).
EXTRA_NEW_TOKENS = 50


class Generation(NamedTuple):
  """What :func:`generate` returns.

  tokens:  [B, N] int32, the new tokens; pad_id after a sequence's EOS.
  lengths: [B] int32, new tokens per sequence, its EOS included (N when a
           sequence never produced EOS).
  """
  tokens: Array
  lengths: Array


class BeamResult(NamedTuple):
  """What :func:`beam_search` returns (the best hypothesis per sequence).

  tokens:  [B, L] int32, the new tokens, EOS included; pad_id after it.
  scores:  [B] float32, log P(tokens) / ((5 + length) / 6) ** alpha.
  lengths: [B] int32, tokens in each hypothesis, its EOS included.
  """
  tokens: Array
  scores: Array
  lengths: Array


def row_tokens(result: Generation | BeamResult, row: int) -> list[int]:
  """Row ``row``'s new tokens as a list, up to its length (EOS included)."""
  tokens = np.asarray(result.tokens[row])
  return tokens[:int(result.lengths[row])].tolist()


# ----------------------------------------------------------------------------
# Checking and placing the inputs (on the host, before anything compiles).


def _concrete(x) -> np.ndarray | None:
  """The host value of x, or None when x is traced (values not known)."""
  if isinstance(x, jax.core.Tracer):
    return None
  return np.asarray(x)


def _ids_and_mask(name: str, ids, mask, pad_id: int,
                  vocab_size: int) -> tuple[Array, Array]:
  """Checked ids [B, T] int32 and mask [B, T] bool (default ids != pad)."""
  if not hasattr(ids, 'shape'):
    ids = np.asarray(ids)
  if ids.ndim != 2:
    raise ValueError(f'{name} must be 2-D [batch, length]; got shape '
                     f'{tuple(ids.shape)} (use ids[None] for one sequence).')
  if ids.shape[0] == 0 or ids.shape[1] == 0:
    raise ValueError(f'{name} is empty (shape {tuple(ids.shape)}); give at '
                     'least one sequence of at least one token.')
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f'{name} must hold integer token ids, got dtype '
                     f'{ids.dtype}.')
  mask_name = name.replace('ids', 'mask')
  if mask is None:
    mask = ids != pad_id
  else:
    if not hasattr(mask, 'shape'):
      mask = np.asarray(mask)
    if tuple(mask.shape) != tuple(ids.shape):
      raise ValueError(f'{mask_name} has shape {tuple(mask.shape)} but '
                       f'{name} has shape {tuple(ids.shape)}.')
  host_ids, host_mask = _concrete(ids), _concrete(mask)
  if host_ids is not None and host_mask is not None:
    host_mask = host_mask.astype(bool)
    empty = np.flatnonzero(~host_mask.any(axis=1))
    if empty.size:
      raise ValueError(f'Row {empty[0]} of {name} has no real tokens (empty '
                       f'input); every row needs at least one token that is '
                       f'not pad_id={pad_id} (or True in {mask_name}).')
    real = host_ids[host_mask]
    bad = real[(real < 0) | (real >= vocab_size)]
    if bad.size:
      raise ValueError(f'{name} holds token id {int(bad[0])}, outside the '
                       f"model's vocabulary [0, {vocab_size}).")
  return jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool)


def _check_id(name: str, value, vocab_size: int, optional: bool = False):
  if value is None and optional:
    return
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
      or not 0 <= value < vocab_size):
    raise ValueError(f'{name}={value!r} must be a token id in [0, '
                     f'{vocab_size}){" or None" if optional else ""}.')


def _check_positive(name: str, value) -> int:
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
      or value < 1):
    raise ValueError(f'{name} must be a positive integer, got {value!r}.')
  return int(value)


class _Inputs(NamedTuple):
  prompt: Array          # [B, T] int32
  prompt_mask: Array     # [B, T] bool
  src: Array | None      # [B, S] int32 (EncoderDecoder only)
  src_mask: Array | None


def _prepare(model, prompt_ids, prompt_mask, src_ids, src_mask, *,
             pad_id: int, bos_id: int, eos_id: int | None) -> _Inputs:
  """Checks everything about the inputs that can be known before tracing."""
  if not isinstance(model, (EncoderDecoder, DecoderLM)):
    raise TypeError('model must be a jax_transformer EncoderDecoder or '
                    f'DecoderLM, got {type(model).__name__}.')
  vocab = model.config.vocab_size
  _check_id('pad_id', pad_id, vocab)
  _check_id('bos_id', bos_id, vocab)
  _check_id('eos_id', eos_id, vocab, optional=True)
  src = None
  if isinstance(model, EncoderDecoder):
    if src_ids is None:
      raise ValueError('An EncoderDecoder needs src_ids [batch, source '
                       'length], the sentences to translate.')
    src, src_mask = _ids_and_mask('src_ids', src_ids, src_mask, pad_id, vocab)
    if prompt_ids is None:
      if prompt_mask is not None:
        raise ValueError('prompt_mask was given without prompt_ids.')
      prompt_ids = np.full((src.shape[0], 1), bos_id, np.int32)
  else:
    if src_ids is not None or src_mask is not None:
      raise ValueError('A DecoderLM has no source: pass the text to continue '
                       'as prompt_ids, not src_ids.')
    if prompt_ids is None:
      raise ValueError('A DecoderLM needs prompt_ids [batch, length] with at '
                       'least one token per row (e.g. BOS).')
  prompt, prompt_mask = _ids_and_mask('prompt_ids', prompt_ids, prompt_mask,
                                      pad_id, vocab)
  if src is not None and src.shape[0] != prompt.shape[0]:
    raise ValueError(f'src_ids has {src.shape[0]} rows but prompt_ids has '
                     f'{prompt.shape[0]}; give one target prefix per source.')
  for name, ids in (('src_ids', src), ('prompt_ids', prompt)):
    if ids is not None and ids.shape[1] > model.config.max_len:
      raise ValueError(f'{name} has length {ids.shape[1]}, longer than the '
                       f"model's max_len={model.config.max_len}.")
  return _Inputs(prompt, prompt_mask, src, src_mask)


def _check_total_length(model, prompt_len: int, new_tokens: int,
                        new_name: str) -> None:
  max_len = model.config.max_len
  if model.config.positional == 'learned' and prompt_len + new_tokens > max_len:
    raise ValueError(
        f'The prompt (padded to {prompt_len} tokens) plus {new_name}='
        f"{new_tokens} exceeds the model's max_len={max_len} (learned "
        'positions); shorten one of them.')


def _resolve_mesh(mesh: Mesh | None, batch_size: int) -> Mesh | None:
  """The mesh to shard the batch over (None: no sharding), Auto-typed.

  Decoding lets XLA propagate shardings from the batch and the parameters,
  so the mesh is used with Auto axis types whatever the caller's types.
  """
  if mesh is None:
    mesh = jax.sharding.get_mesh()
    if mesh.empty:
      return None
  if 'data' not in mesh.axis_names:
    raise ValueError(f"The mesh has axes {mesh.axis_names}; decoding shards "
                     "the batch over an axis named 'data'.")
  data = mesh.shape['data']
  if batch_size % data:
    raise ValueError(f'Batch size {batch_size} is not divisible by the '
                     f"mesh's 'data' axis ({data}); pad the batch.")
  if any(t != AxisType.Auto for t in mesh.axis_types):
    mesh = Mesh(mesh.devices, mesh.axis_names,
                axis_types=(AxisType.Auto,) * len(mesh.axis_names))
  return mesh


def _batch_spec(ndim: int) -> P:
  return P('data', *([P.UNCONSTRAINED] * (ndim - 1)))


def _place(tree, mesh: Mesh | None):
  """Puts batch arrays (leading axis B) on the mesh, sharded over 'data'."""
  if mesh is None:
    return tree
  return jax.tree.map(
      lambda x: jax.device_put(x, NamedSharding(mesh, P('data'))), tree)


def _place_state(state, mesh: Mesh | None):
  """Parameters as given, made usable on the mesh.

  One placed on the mesh's devices keeps its partition spec (moved to the
  Auto-typed twin of an Explicit mesh: same devices and layout, no data
  moves); one committed elsewhere (e.g. restored onto one device) is
  replicated over the mesh. Uncommitted ones are left for jit to place.
  """
  if mesh is None:
    return state
  devices = set(mesh.devices.flat)

  def place(x):
    sharding = getattr(x, 'sharding', None)
    if sharding is None or not getattr(x, 'committed', True):
      return x
    if set(sharding.device_set) != devices:
      return jax.device_put(x, NamedSharding(mesh, P()))
    if (isinstance(sharding, NamedSharding)
        and sharding.mesh.axis_types != mesh.axis_types
        and sharding.mesh.axis_names == mesh.axis_names):
      return jax.device_put(x, NamedSharding(mesh, sharding.spec))
    return x

  return jax.tree.map(place, state)


def _constrain(tree, mesh: Mesh | None):
  """Keeps batch-leading arrays sharded over 'data' inside the loop."""
  if mesh is None:
    return tree

  def f(x):
    if x.ndim == 0:
      return x
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, _batch_spec(x.ndim)))

  return jax.tree.map(f, tree)


# ----------------------------------------------------------------------------
# The jitted programs.


def _start(model: Model, inputs: _Inputs, cache_len: int) -> KVCache:
  """An empty cache; for the encoder-decoder, the source encoded once."""
  if isinstance(model, EncoderDecoder):
    memory = model.encode(inputs.src, inputs.src_mask)
    return model.init_cache(memory, inputs.src_mask, cache_len)
  return model.init_cache(inputs.prompt.shape[0], cache_len)


def _prefill(model: Model, inputs: _Inputs, cache_len: int, mesh):
  """Runs the whole prompt at once: (logits after its last real token
  [B, V] float32, cache)."""
  cache = _constrain(_start(model, inputs, cache_len), mesh)
  logits, cache = model.extend(inputs.prompt, cache, inputs.prompt_mask)
  b, t = inputs.prompt.shape
  # The last True of each mask row (any padding pattern).
  last = t - 1 - jnp.argmax(inputs.prompt_mask[:, ::-1], axis=1)
  return logits[jnp.arange(b), last], _constrain(cache, mesh)


@functools.partial(jax.jit, static_argnames=(
    'graphdef', 'max_new_tokens', 'sampler', 'mesh'))
def _generate_jit(graphdef, state, inputs: _Inputs, key: Array,
                  eos_id: Array, pad_id: Array, *, max_new_tokens: int,
                  sampler: TokenChooser, mesh: Mesh | None):
  # eos_id -1 (no EOS) matches no token.
  model = nnx.merge(graphdef, state)
  b, t = inputs.prompt.shape
  n = max_new_tokens
  # The last new token is never fed back, so it needs no slot.
  logits, cache = _prefill(model, inputs, t + n - 1, mesh)
  first = sampler(logits, jax.random.fold_in(key, 0)).astype(jnp.int32)
  tokens = jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(first)
  done = first == eos_id
  lengths = jnp.where(done, 1, n).astype(jnp.int32)

  def cond(carry):
    i, _, done, _, _ = carry
    return (i < n) & ~jnp.all(done)

  def body(carry):
    i, tokens, done, lengths, cache = carry
    previous = jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1)
    logits, cache = model.extend(previous, cache)
    token = sampler(logits[:, 0], jax.random.fold_in(key, i)).astype(
        jnp.int32)
    token = jnp.where(done, pad_id, token)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], i,
                                                 axis=1)
    ended = ~done & (token == eos_id)
    lengths = jnp.where(ended, i + 1, lengths)
    done = done | ended
    return (i + 1, _constrain(tokens, mesh), done, lengths,
            _constrain(cache, mesh))

  carry = (jnp.int32(1), _constrain(tokens, mesh), done, lengths, cache)
  _, tokens, _, lengths, _ = jax.lax.while_loop(cond, body, carry)
  return Generation(tokens, lengths)


def length_penalty(length, alpha: float):
  """GNMT's ((5 + length) / 6) ** alpha (Wu et al., 2016, eq. 14)."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


class _Beams(NamedTuple):
  """Beam state for B sequences with K beams each, L new-token slots."""
  alive: Array           # [B, K, L] int32 tokens of the live hypotheses
  alive_logp: Array      # [B, K] float32 log-probabilities (-inf: empty)
  finished: Array        # [B, K, L] int32 the best finished, best first
  finished_score: Array  # [B, K] float32 penalised scores (-inf: empty)
  finished_len: Array    # [B, K] int32
  done: Array            # [B] bool: no more hypotheses accepted


def _gather_beams(x: Array, index: Array) -> Array:
  """x [B, K, ...] -> x[b, index[b, j], ...] for index [B, J]."""
  index = index.reshape(index.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


def _beam_step(t: int | Array, logp: Array, beams: _Beams, *, beam_size: int,
               alpha: float, max_len: int, eos_id: Array):
  """Extends every live beam by every token and keeps the best.

  logp [B, K, V]: next-token log-probabilities of the live beams; t: the
  slot (0-based) the new token goes to. Of the 2K best extensions (by
  log-probability), those among the best K that end with EOS (or all of
  the best K at the last slot) enter the finished set, which keeps the K
  best by penalised score; the K best extensions not ending in EOS live on.
  A sequence is done once it holds K finished hypotheses (or at the last
  slot). Returns (new beams, parent beam of each live beam [B, K]).
  """
  b, k, v = logp.shape
  candidates = (beams.alive_logp[:, :, None] + logp).reshape(b, k * v)
  top_logp, top = jax.lax.top_k(candidates, min(2 * k, k * v))   # [B, 2K]
  parent, token = top // v, (top % v).astype(jnp.int32)
  seqs = _gather_beams(beams.alive, parent)                        # [B,2K,L]
  seqs = jax.lax.dynamic_update_slice_in_dim(seqs, token[:, :, None], t,
                                             axis=2)
  is_eos = token == eos_id
  best_k = jnp.arange(top.shape[1]) < k
  finishing = best_k & (is_eos | (t == max_len - 1)) & ~beams.done[:, None]
  length = t + 1
  new_score = jnp.where(finishing, top_logp / length_penalty(length, alpha),
                        -jnp.inf)
  pool_score = jnp.concatenate([beams.finished_score, new_score], axis=1)
  pool_seqs = jnp.concatenate([beams.finished, seqs], axis=1)
  pool_len = jnp.concatenate(
      [beams.finished_len, jnp.full(new_score.shape, length, jnp.int32)],
      axis=1)
  finished_score, keep = jax.lax.top_k(pool_score, k)
  live_logp, live = jax.lax.top_k(jnp.where(is_eos, -jnp.inf, top_logp), k)
  done = (beams.done | (jnp.sum(finished_score > -jnp.inf, axis=1) >= k)
          | (t == max_len - 1))
  new = _Beams(
      alive=_gather_beams(seqs, live), alive_logp=live_logp,
      finished=_gather_beams(pool_seqs, keep), finished_score=finished_score,
      finished_len=jnp.take_along_axis(pool_len, keep, axis=1), done=done)
  return new, jnp.take_along_axis(parent, live, axis=1)


def _reorder_cache(cache: KVCache, parent: Array) -> KVCache:
  """Self-attention rows [B*K, ...] follow their parent beams [B, K].

  The cross-attention keys/values are the same for every beam of a
  sequence, so they are not moved.
  """
  b, k = parent.shape

  def regroup(x):
    y = _gather_beams(x.reshape(b, k, *x.shape[1:]), parent)
    return y.reshape(x.shape)

  return cache._replace(keys=tuple(map(regroup, cache.keys)),
                        values=tuple(map(regroup, cache.values)),
                        valid=regroup(cache.valid))


@functools.partial(jax.jit, static_argnames=(
    'graphdef', 'beam_size', 'alpha', 'max_len', 'mesh'))
def _beam_search_jit(graphdef, state, inputs: _Inputs, eos_id: Array,
                     pad_id: Array, *, beam_size: int, alpha: float,
                     max_len: int, mesh: Mesh | None):
  model = nnx.merge(graphdef, state)
  b, t = inputs.prompt.shape
  k, n = beam_size, max_len
  # The prompt is run once per sequence, then its cache copied per beam
  # (cross-attention keys/values included: computed once, repeated).
  logits, cache = _prefill(model, inputs, t + n - 1, mesh)
  cache = jax.tree.map(
      lambda x: x if x.ndim == 0 else jnp.repeat(x, k, axis=0), cache)
  cache = _constrain(cache, mesh)
  logp = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.broadcast_to(logp[:, None], (b, k, logp.shape[-1]))
  empty = jnp.full((b, k), -jnp.inf, jnp.float32)
  beams = _Beams(
      alive=jnp.full((b, k, n), pad_id, jnp.int32),
      # One live beam to start from, so the first step has no duplicates.
      alive_logp=empty.at[:, 0].set(0.0),
      finished=jnp.full((b, k, n), pad_id, jnp.int32),
      finished_score=empty, finished_len=jnp.zeros((b, k), jnp.int32),
      done=jnp.zeros((b,), bool))
  step = functools.partial(_beam_step, beam_size=k, alpha=alpha, max_len=n,
                           eos_id=eos_id)

  def advance(i, beams, parent, cache):
    """Feeds the live beams' newest tokens: next log-probs [B, K, V]."""
    cache = _reorder_cache(cache, parent)
    newest = jax.lax.dynamic_slice_in_dim(beams.alive, i, 1, axis=2)
    logits, cache = model.extend(newest.reshape(b * k, 1), cache)
    logp = jax.nn.log_softmax(logits[:, 0], axis=-1).reshape(b, k, -1)
    return logp, _constrain(cache, mesh)

  def cond(carry):
    i, beams, _, _ = carry
    return (i < n) & ~jnp.all(beams.done)

  def body(carry):
    i, beams, logp, cache = carry
    beams, parent = step(i, logp, beams)
    beams = _constrain(beams, mesh)
    # The last step's extensions are never fed back.
    logp, cache = jax.lax.cond(
        (i + 1 < n) & ~jnp.all(beams.done),
        lambda: advance(i, beams, parent, cache), lambda: (logp, cache))
    return i + 1, beams, logp, cache

  _, beams, _, _ = jax.lax.while_loop(
      cond, body, (jnp.int32(0), _constrain(beams, mesh), logp, cache))
  return BeamResult(beams.finished[:, 0], beams.finished_score[:, 0],
                    beams.finished_len[:, 0])


# ----------------------------------------------------------------------------
# Public entry points.


def _special_ids(eos_id: int | None, pad_id: int) -> tuple[Array, Array]:
  """Traced, so other ids reuse the compiled program; no EOS is -1."""
  return (jnp.int32(-1 if eos_id is None else eos_id), jnp.int32(pad_id))


def _run(fn, model, inputs: _Inputs, mesh: Mesh | None, *args, **static):
  mesh = _resolve_mesh(mesh, inputs.prompt.shape[0])
  graphdef, state = nnx.split(model)
  state, inputs = _place_state(state, mesh), _place(inputs, mesh)
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
             mesh: Mesh | None = None) -> Generation:
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

  Returns ``Generation(tokens [B, N], lengths [B])``.
  """
  n = _check_positive('max_new_tokens', max_new_tokens)
  if not callable(sampler):
    raise TypeError('sampler must be callable as sampler(logits, key), e.g. '
                    'jax_transformer.sampling.greedy or Sampler(...).')
  if key is None:
    if not is_deterministic(sampler):
      raise ValueError('Sampling needs a key, e.g. key=jax.random.key(0); '
                       'only a greedy sampler runs without one.')
    key = jax.random.key(0)
  inputs = _prepare(model, prompt_ids, prompt_mask, src_ids, src_mask,
                    pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
  _check_total_length(model, inputs.prompt.shape[1], n, 'max_new_tokens')
  return _run(_generate_jit, model, inputs, mesh, key,
              *_special_ids(eos_id, pad_id), max_new_tokens=n,
              sampler=sampler)


def beam_search(model: Model, prompt_ids: Any = None, prompt_mask: Any = None,
                *, src_ids: Any = None, src_mask: Any = None,
                beam_size: int = 4, alpha: float = 0.6,
                max_len: int | None = None, eos_id: int | None = EOS_ID,
                pad_id: int = PAD_ID, bos_id: int = BOS_ID,
                mesh: Mesh | None = None) -> BeamResult:
  """Beam search with GNMT's length penalty, under one jit.

  Inputs as :func:`generate`. Hypotheses are ranked by
  ``log P(y) / ((5 + |y|) / 6) ** alpha`` with |y| the new tokens, EOS
  included. At each step the 2K best extensions are considered: those among
  the best K ending in EOS are finished, the K best others live on; a
  sequence stops when it holds K finished hypotheses, or after ``max_len``
  new tokens (live hypotheses are then finished as they are). With
  ``beam_size=1`` this is greedy decoding.

  max_len: most new tokens per hypothesis; default the input length
    (source for an EncoderDecoder, prompt for a DecoderLM, padded) + 50,
    capped by the model's max_len for learned positions.

  Returns ``BeamResult(tokens [B, max_len], scores [B], lengths [B])``.
  """
  k = _check_positive('beam_size', beam_size)
  if (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
      or not alpha >= 0):
    raise ValueError(f'alpha must be a number >= 0, got {alpha!r}.')
  inputs = _prepare(model, prompt_ids, prompt_mask, src_ids, src_mask,
                    pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
  t = inputs.prompt.shape[1]
  if max_len is None:
    source = inputs.src if inputs.src is not None else inputs.prompt
    max_len = source.shape[1] + EXTRA_NEW_TOKENS
    if model.config.positional == 'learned':
      max_len = min(max_len, model.config.max_len - t)
      if max_len < 1:
        raise ValueError(f'The prompt (padded to {t} tokens) leaves no room '
                         f"under the model's max_len="
                         f'{model.config.max_len} (learned positions).')
  n = _check_positive('max_len', max_len)
  _check_total_length(model, t, n, 'max_len')
  return _run(_beam_search_jit, model, inputs, mesh,
              *_special_ids(eos_id, pad_id), beam_size=k, alpha=float(alpha),
              max_len=n)
