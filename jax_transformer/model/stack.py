"""A stack of identical layers: a Python loop, or one lax.scan over stacked
parameters, each layer optionally rematerialised.

Unrolled (``scan_layers=False``), the stack is an ``nnx.List`` and its
parameters are named ``layers.0.ff.wi``, ``layers.1.ff.wi``, ...; the
compiled step holds one copy of the layer per layer, so compile time grows
with depth. Scanned, the stack is one layer module whose parameters carry a
leading ``'layers'`` axis (``layers.ff.wi`` [L, D, F]) and the step holds
one copy run L times. ``params.py`` converts between the two layouts.

Remat (``jax.checkpoint``) keeps, per layer, only what its policy saves
and recomputes the rest in the backward pass: 'full' saves the layer's
input, 'dots' also the outputs of matmuls without batch dimensions (the
projections, not attention's batched products).

Dropout: the loop without remat draws from the caller's ``nnx.Rngs`` call
by call, as it always has. Scan and remat need a pure layer function, so
each layer gets its own key, split from one draw of the caller's stream.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.model.config import ModelConfig

Array = jax.Array
# body(layer, x, rngs) -> x: one layer's work; rngs is None when
# deterministic.
Body = Callable[[nnx.Module, Array, 'nnx.Rngs | None'], Array]

REMAT_POLICIES = {
    'full': None,  # jax.checkpoint's default: save nothing but the inputs
    'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def stack_layers(layers: list[nnx.Module]) -> nnx.Module:
  """One module holding ``layers``' parameters stacked on a leading axis.

  Each stacked parameter's logical axes gain a leading 'layers' (never
  sharded), so sharding rules apply to the rest unchanged.
  """
  graphdef = nnx.graphdef(layers[0])
  states = [nnx.state(layer) for layer in layers]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  for _, variable in nnx.to_flat_state(stacked):
    axes = variable.get_metadata().get('out_sharding') or ()
    variable.set_metadata(out_sharding=('layers', *axes))
  return nnx.merge(graphdef, stacked)


def layer_at(stacked: nnx.Module, index: int) -> nnx.Module:
  """Layer ``index`` of a stacked module, as an ordinary layer module."""
  graphdef, state = nnx.split(stacked)
  return nnx.merge(graphdef, jax.tree.map(lambda a: a[index], state))


def num_stacked(stacked: nnx.Module) -> int:
  return jax.tree.leaves(nnx.state(stacked))[0].shape[0]


def unrolled(layers: nnx.Module) -> list[nnx.Module]:
  """Each layer as its own module, whichever the layout."""
  if isinstance(layers, nnx.List):
    return list(layers)
  return [layer_at(layers, i) for i in range(num_stacked(layers))]


def _layer_keys(rngs: nnx.Rngs | None, count: int) -> Array | None:
  return None if rngs is None else jax.random.split(rngs.dropout(), count)


def _pure(graphdef, body: Body, remat: str):
  """body as a function of (layer state, x, dropout key), checkpointed
  under the remat policy."""

  def apply(state, x, key):
    rngs = None if key is None else nnx.Rngs(dropout=key)
    return body(nnx.merge(graphdef, state), x, rngs)

  if remat == 'none':
    return apply
  return jax.checkpoint(apply, policy=REMAT_POLICIES[remat])


def run(layers: nnx.Module, x: Array, body: Body, config: ModelConfig,
        rngs: nnx.Rngs | None) -> Array:
  """x [B, T, D] through every layer of ``layers`` (an nnx.List, or a
  stacked module when config.scan_layers) -> [B, T, D]."""
  if isinstance(layers, nnx.List) and config.remat == 'none':
    for layer in layers:
      x = body(layer, x, rngs)
    return x
  if isinstance(layers, nnx.List):
    keys = _layer_keys(rngs, len(layers))
    for i, layer in enumerate(layers):
      graphdef, state = nnx.split(layer)
      x = _pure(graphdef, body, config.remat)(
          state, x, None if keys is None else keys[i])
    return x
  graphdef, state = nnx.split(layers)
  keys = _layer_keys(rngs, num_stacked(layers))
  apply = _pure(graphdef, body, config.remat)

  def step(x, slice_):
    layer_state, key = slice_
    return apply(layer_state, x, key), None

  x, _ = jax.lax.scan(step, x, (state, keys))
  return x


def build(config: ModelConfig, make_layer: Callable[[], nnx.Module],
          count: int) -> nnx.Module:
  """``count`` layers from ``make_layer``, in the layout config asks for.

  The layers are made one by one either way, so a scanned model starts from
  exactly the parameters of the unrolled one with the same seed.
  """
  layers = [make_layer() for _ in range(count)]
  if config.scan_layers and layers:
    return stack_layers(layers)
  return nnx.List(layers)
