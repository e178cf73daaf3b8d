"""Parameters as a flat dict of arrays keyed by dotted path.

The trainer, the optimizer and checkpoints see plain ``{'layers.0.ff.wi':
array}`` dicts: easy to shard, save and convert. :class:`ModelDef` turns such
a dict back into the NNX module inside a jitted function.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
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
