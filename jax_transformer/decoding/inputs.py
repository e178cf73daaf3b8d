"""Checking and placing decoding inputs, on the host before anything
compiles: ids and masks, special ids, lengths, and the mesh the batch is
sharded over."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_transformer import fields
from jax_transformer.errors import UsageError
from jax_transformer.model.attention import KVCache
from jax_transformer.model.families import family_of

Array = jax.Array


def concrete(x) -> np.ndarray | None:
  """The host value of x, or None when x is traced (values not known)."""
  if isinstance(x, jax.core.Tracer):
    return None
  return np.asarray(x)


def ids_and_mask(name: str, ids, mask, pad_id: int,
                  vocab_size: int) -> tuple[Array, Array]:
  """Checked ids [B, T] int32 and mask [B, T] bool (default ids != pad)."""
  if not hasattr(ids, 'shape'):
    ids = np.asarray(ids)
  if ids.ndim != 2:
    raise UsageError(f'{name} must be 2-D [batch, length]; got shape '
                     f'{tuple(ids.shape)} (use ids[None] for one sequence).')
  if ids.shape[0] == 0 or ids.shape[1] == 0:
    raise UsageError(f'{name} is empty (shape {tuple(ids.shape)}); give at '
                     'least one sequence of at least one token.')
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise UsageError(f'{name} must hold integer token ids, got dtype '
                     f'{ids.dtype}.')
  mask_name = name.replace('ids', 'mask')
  if mask is None:
    mask = ids != pad_id
  else:
    if not hasattr(mask, 'shape'):
      mask = np.asarray(mask)
    if tuple(mask.shape) != tuple(ids.shape):
      raise UsageError(f'{mask_name} has shape {tuple(mask.shape)} but '
                       f'{name} has shape {tuple(ids.shape)}.')
  host_ids, host_mask = concrete(ids), concrete(mask)
  if host_ids is not None and host_mask is not None:
    host_mask = host_mask.astype(bool)
    empty = np.flatnonzero(~host_mask.any(axis=1))
    if empty.size:
      raise UsageError(f'Row {empty[0]} of {name} has no real tokens (empty '
                       f'input); every row needs at least one token that is '
                       f'not pad_id={pad_id} (or True in {mask_name}).')
    real = host_ids[host_mask]
    bad = real[(real < 0) | (real >= vocab_size)]
    if bad.size:
      raise UsageError(f'{name} holds token id {int(bad[0])}, outside the '
                       f"model's vocabulary [0, {vocab_size}); encode the "
                       'text with the tokenizer the model was trained with.')
  return jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool)


def check_id(name: str, value, vocab_size: int, optional: bool = False):
  if value is None and optional:
    return
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
      or not 0 <= value < vocab_size):
    raise UsageError(f'{name}={value!r} must be a token id in [0, '
                     f'{vocab_size}){" or None" if optional else ""}.')


def check_positive(name: str, value) -> int:
  return fields.check_integer(name, value)


class Inputs(NamedTuple):
  prompt: Array          # [B, T] int32
  prompt_mask: Array     # [B, T] bool
  src: Array | None      # [B, S] int32 (EncoderDecoder only)
  src_mask: Array | None


def prepare(model, prompt_ids, prompt_mask, src_ids, src_mask, *,
             pad_id: int, bos_id: int, eos_id: int | None) -> Inputs:
  """Checks everything about the inputs that can be known before tracing."""
  record = family_of(model)  # TypeError for an object no family builds
  if record.empty_cache is None:
    raise UsageError(f'A {type(model).__name__} does not generate text.')
  has_source = record.has_source
  vocab = model.config.vocab_size
  check_id('pad_id', pad_id, vocab)
  check_id('bos_id', bos_id, vocab)
  check_id('eos_id', eos_id, vocab, optional=True)
  src = None
  if has_source:
    if src_ids is None:
      raise UsageError('An EncoderDecoder needs src_ids [batch, source '
                       'length], the sentences to translate.')
    src, src_mask = ids_and_mask('src_ids', src_ids, src_mask, pad_id, vocab)
    if prompt_ids is None:
      if prompt_mask is not None:
        raise UsageError('prompt_mask was given without prompt_ids.')
      prompt_ids = np.full((src.shape[0], 1), bos_id, np.int32)
  else:
    if src_ids is not None or src_mask is not None:
      raise UsageError('A DecoderLM has no source: pass the text to continue '
                       'as prompt_ids, not src_ids.')
    if prompt_ids is None:
      raise UsageError('A DecoderLM needs prompt_ids [batch, length] with at '
                       'least one token per row (e.g. BOS).')
  prompt, prompt_mask = ids_and_mask('prompt_ids', prompt_ids, prompt_mask,
                                      pad_id, vocab)
  if src is not None and src.shape[0] != prompt.shape[0]:
    raise UsageError(f'src_ids has {src.shape[0]} rows but prompt_ids has '
                     f'{prompt.shape[0]}; give one target prefix per source.')
  for name, ids in (('src_ids', src), ('prompt_ids', prompt)):
    if ids is not None and ids.shape[1] > model.config.max_len:
      raise UsageError(f'{name} has length {ids.shape[1]}, longer than the '
                       f"model's max_len={model.config.max_len}.")
  return Inputs(prompt, prompt_mask, src, src_mask)


def check_total_length(model, prompt_len: int, new_tokens: int,
                        new_name: str) -> None:
  max_len = model.config.max_len
  if model.config.positional == 'learned' and prompt_len + new_tokens > max_len:
    raise UsageError(
        f'The prompt (padded to {prompt_len} tokens) plus {new_name}='
        f"{new_tokens} exceeds the model's max_len={max_len} (learned "
        'positions); shorten one of them.')


def resolve_mesh(mesh: Mesh | None, batch_size: int) -> Mesh | None:
  """The mesh to shard the batch over (None: no sharding), Auto-typed.

  Decoding lets XLA propagate shardings from the batch and the parameters,
  so the mesh is used with Auto axis types whatever the caller's types.
  """
  if mesh is None:
    mesh = jax.sharding.get_mesh()
    if mesh.empty:
      return None
  if 'data' not in mesh.axis_names:
    raise UsageError(f"The mesh has axes {mesh.axis_names}; decoding shards "
                     "the batch over an axis named 'data'.")
  data = mesh.shape['data']
  if batch_size % data:
    raise UsageError(f'Batch size {batch_size} is not divisible by the '
                     f"mesh's 'data' axis ({data}); pad the batch.")
  if any(t != AxisType.Auto for t in mesh.axis_types):
    mesh = Mesh(mesh.devices, mesh.axis_names,
                axis_types=(AxisType.Auto,) * len(mesh.axis_names))
  return mesh


def batch_spec(ndim: int) -> P:
  return P('data', *([P.UNCONSTRAINED] * (ndim - 1)))


def place(tree, mesh: Mesh | None):
  """Puts batch arrays (leading axis B) on the mesh, sharded over 'data'."""
  if mesh is None:
    return tree
  return jax.tree.map(
      lambda x: jax.device_put(x, NamedSharding(mesh, P('data'))), tree)


def place_state(state, mesh: Mesh | None):
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


def constrain(tree, mesh: Mesh | None):
  """Keeps batch-leading arrays sharded over 'data' inside the loop, and
  a KV cache's slots over 'sequence' where the mesh has that axis
  (:func:`cache_spec`)."""
  if mesh is None:
    return tree

  def f(x):
    if isinstance(x, KVCache):
      return jax.tree.map(
          lambda a, spec: jax.lax.with_sharding_constraint(
              a, NamedSharding(mesh, spec)), x, cache_spec(x, mesh))
    if x.ndim == 0:
      return x
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, batch_spec(x.ndim)))

  return jax.tree.map(f, tree, is_leaf=lambda x: isinstance(x, KVCache))


def cache_spec(cache: KVCache, mesh: Mesh) -> KVCache:
  """The cache's layout: rows over 'data'; the self-attention slots of
  keys, values and the valid mask split over the mesh's 'sequence' axis
  when it has one that divides them, so a long prompt's cache is spread
  over its devices (attention then reads each device's slots and sums
  over them); everything else by rows."""
  n = mesh.shape.get('sequence', 1)
  split = n > 1 and cache.max_len % n == 0
  slots = 'sequence' if split else P.UNCONSTRAINED
  by_slot = P('data', P.UNCONSTRAINED, slots, P.UNCONSTRAINED)
  return KVCache(
      keys=tuple(by_slot for _ in cache.keys),
      values=tuple(by_slot for _ in cache.values),
      valid=P('data', slots),
      index=P() if jnp.ndim(cache.index) == 0 else P('data'),
      cross_keys=tuple(batch_spec(4) for _ in cache.cross_keys),
      cross_values=tuple(batch_spec(4) for _ in cache.cross_values),
      memory_mask=None if cache.memory_mask is None else batch_spec(2))
