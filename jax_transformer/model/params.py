"""Parameters as a flat dict of arrays keyed by dotted path.

The trainer, the optimizer and checkpoints see plain ``{'layers.0.ff.wi':
array}`` dicts: easy to shard, save and convert. :class:`ModelDef` turns such
a dict back into the NNX module inside a jitted function.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

Params = dict[str, jax.Array]


def path_str(path: tuple) -> str:
  return '.'.join(str(p) for p in path)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelDef:
  """The static half of a split module: its graph and its variables' slots."""
  graphdef: Any
  variables: tuple[tuple[tuple, nnx.Variable], ...]

  def merge(self, params: Params) -> nnx.Module:
    """The module holding ``params`` (works under jit)."""
    leaves = [(p, v.replace(params[path_str(p)])) for p, v in self.variables]
    return nnx.merge(self.graphdef, nnx.from_flat_state(leaves))

  def merge_for_training(self, params: Params, key: jax.Array
                         ) -> nnx.Module:
    """The module a train step differentiates (``key``: the step's dropout
    key): ``merge`` here; LoRA's applies its adapters factored
    (``lora.LoraModelDef``)."""
    del key
    return self.merge(params)

  @property
  def logical_axes(self) -> dict[str, tuple[str, ...]]:
    """Each parameter's logical axis names, from where it was created."""
    return {path_str(p): tuple(v.get_metadata().get('out_sharding') or ())
            for p, v in self.variables}


def split(model: nnx.Module) -> tuple[ModelDef, Params]:
  """(static definition, flat parameter dict) of a module of Params only."""
  graphdef, state = nnx.split(model)
  flat = tuple(nnx.to_flat_state(state))
  params = {path_str(p): v[...] for p, v in flat}
  return ModelDef(graphdef, flat), params


def abstract(build: Callable[[], nnx.Module]) -> tuple[ModelDef, Params]:
  """Like :func:`split` on ``build()``, with ShapeDtypeStructs as values.

  Nothing is computed: use it to plan shardings before initialising.
  """
  model = nnx.eval_shape(build)
  graphdef, state = nnx.split(model)
  flat = tuple(nnx.to_flat_state(state))
  return ModelDef(graphdef, flat), {path_str(p): v.get_value()
                                    for p, v in flat}


# Attributes that hold a stack of layers (see ``stack.py``): unrolled, their
# parameters are named 'layers.3.ff.wi'; scanned, 'layers.ff.wi' with the
# layer on a leading axis.
STACKS = ('layers', 'encoder_layers', 'decoder_layers')


def _split_name(name: str) -> tuple[str, str | None, str] | None:
  """'layers.3.ff.wi' -> ('layers', '3', 'ff.wi'); 'layers.ff.wi' ->
  ('layers', None, 'ff.wi'); a name outside any stack -> None."""
  head, _, rest = name.partition('.')
  if head not in STACKS or not rest:
    return None
  index, _, tail = rest.partition('.')
  return (head, index, tail) if index.isdigit() else (head, None, rest)


def is_scanned(names) -> bool:
  """Whether parameter names (or a params dict) are in the scanned layout."""
  return any(p is not None and p[1] is None
             for p in map(_split_name, names))


def _stacked_spec(x, extra: int):
  """x's sharding with a leading unsharded axis added (extra=1) or dropped
  (extra=-1); other shardings and None stay as they are."""
  sharding = getattr(x, 'sharding', None)
  if not isinstance(sharding, jax.sharding.NamedSharding):
    return sharding
  spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
  spec = (None, *spec) if extra > 0 else spec[1:]
  return jax.sharding.NamedSharding(sharding.mesh,
                                    jax.sharding.PartitionSpec(*spec))


def _stack(xs: list):
  first = xs[0]
  if isinstance(first, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct((len(xs), *first.shape), first.dtype,
                                sharding=_stacked_spec(first, 1))
  if not hasattr(first, 'shape'):  # e.g. optax.MaskedNode
    return first
  return jnp.stack(xs)


def _slice(x, index: int):
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype,
                                sharding=_stacked_spec(x, -1))
  if not hasattr(x, 'shape'):
    return x
  return x[index]


def scanned(params: Params) -> Params:
  """Unrolled stacks ('layers.3.ff.wi') stacked on a leading axis
  ('layers.ff.wi' [L, ...]); other entries unchanged. Idempotent."""
  out, groups = {}, {}
  for name, x in params.items():
    parts = _split_name(name)
    if parts is None or parts[1] is None:
      out[name] = x
    else:
      groups.setdefault(f'{parts[0]}.{parts[2]}', {})[int(parts[1])] = x
  for name, by_index in groups.items():
    out[name] = _stack([by_index[i] for i in range(len(by_index))])
  return out


def unrolled(params: Params) -> Params:
  """Scanned stacks ('layers.ff.wi' [L, ...]) split into one entry per
  layer ('layers.3.ff.wi'); other entries unchanged. Idempotent."""
  out = {}
  for name, x in params.items():
    parts = _split_name(name)
    if parts is None or parts[1] is not None:
      out[name] = x
      continue
    head, _, tail = parts
    for i in range(x.shape[0]):
      out[f'{head}.{i}.{tail}'] = _slice(x, i)
  return out


def _is_param_dict(x) -> bool:
  return (isinstance(x, dict) and bool(x)
          and any(_split_name(k) is not None for k in x if isinstance(k, str)))


def to_layout(tree, scan: bool):
  """Every parameter dict inside tree (params, the optimizer's moments,
  their abstract shapes and shardings) in the scanned or unrolled layout."""
  convert = scanned if scan else unrolled
  return jax.tree.map(lambda x: convert(x) if _is_param_dict(x) else x,
                      tree, is_leaf=_is_param_dict)
