"""A projection's kernel with a low-rank adapter beside it, applied
factored: ``x W + s (drop(x) A) B`` (LoRA's training forward).

The model's projections (attention's query, key, value and out, the
feed-forward's wi, wi_gate and wo) read their kernel through
:func:`project`. The kernel Variable holds a plain array everywhere but in
a LoRA train step, where ``lora.LoraModelDef.factored`` puts a
:class:`LowRank` in each adapted kernel's slot. Factored, the backward of
a frozen W is an activation gradient only: no [in, out] weight gradient
(nor the [in, out] product A B of the merged forward) is ever formed, and
the adapters' gradients come from [tokens, r] products.

A stacked layer (``scan_layers``) holds stacked leaves ([L, ...]);
``lax.scan`` slices every leaf, the dropout keys included, so each layer
sees its own.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

Array = jax.Array
# The rank's letter in the adapters' einsum specs (the model's specs use
# capitals only).
RANK = 'r'


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LowRank:
  """W with its adapter, for :func:`project`.

  kernel: W [*in, *out]; a: A [*in, r]; b: B [r, *out]; key: the dropout
  key of A's input (None: no dropout, as in evaluation); scale: alpha / r;
  dropout: the rate of A's input dropout.
  """
  kernel: Array
  a: Array
  b: Array
  key: Array | None
  scale: float = dataclasses.field(metadata=dict(static=True))
  dropout: float = dataclasses.field(default=0.0,
                                     metadata=dict(static=True))


def _dropped(x: Array, rate: float, key: Array | None) -> Array:
  """Inverted dropout of x; x itself without a key or at rate 0."""
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype),
                   jnp.zeros_like(x))


def _adapter_specs(spec: str) -> tuple[str, str]:
  """'BTD,DNH->BTNH' -> ('BTD,Dr->BTr', 'BTr,rNH->BTNH'): x A, then its
  product with B (the kernel's input axes are its leading ones)."""
  lhs, rest = spec.split(',')
  rhs, out = rest.split('->')
  ins = ''.join(c for c in rhs if c in lhs)
  assert rhs.startswith(ins) and RANK not in spec, spec
  batch = ''.join(c for c in lhs if c not in rhs)
  return (f'{lhs},{ins}{RANK}->{batch}{RANK}',
          f'{batch}{RANK},{RANK}{rhs[len(ins):]}->{out}')


def contract(spec: str, x: Array, w: Array) -> Array:
  """``jnp.einsum(spec, x, w)`` for x [batch..., *in], w [*in, *out], with
  the contracted axes merged into one where there are several.

  The attention's output projection contracts over heads and head_dim
  ('BTNH,NHD->BTD'); as two axes, XLA:CPU lays the product out by
  transposing the whole [N, H, D] weight on every call (a copy of the
  weight per layer per decoded token). Merged, both reshapes are free for
  row-major arrays and the weight is read as stored.
  """
  lhs, rest = spec.split(',')
  rhs, out = rest.split('->')
  ins = ''.join(c for c in rhs if c in lhs)
  n = len(ins)
  if n < 2 or not (lhs.endswith(ins) and rhs.startswith(ins)):
    return jnp.einsum(spec, x, w)
  x = x.reshape(*x.shape[:-n], -1)
  w = w.reshape(-1, *w.shape[n:])
  return jnp.einsum(f'{lhs[:-n]}{ins[0]},{ins[0]}{rhs[n:]}->{out}', x, w)


def project(x: Array, kernel: nnx.Variable | Array | LowRank, spec: str,
            dtype) -> Array:
  """``jnp.einsum(spec, x, W)`` in ``dtype``, plus the adapter's
  ``scale * (drop(x) A) B`` when the kernel is a :class:`LowRank`.

  x [batch..., *in]; kernel a Variable (or its value) holding W [*in, *out]
  or a LowRank -> [batch..., *out] (the axes as spec orders them).
  """
  if isinstance(kernel, nnx.Variable):
    kernel = kernel.get_value()
    # (not ``[...]``: that indexes the value, which a LowRank is not)
  x = x.astype(dtype)
  if not isinstance(kernel, LowRank):
    if not isinstance(kernel, jax.Array):  # int8 weights: [...] dequantizes
      kernel = kernel[...]
    return contract(spec, x, kernel.astype(dtype))
  y = contract(spec, x, kernel.kernel.astype(dtype))
  into, out_of = _adapter_specs(spec)
  h = contract(into, _dropped(x, kernel.dropout, kernel.key),
               kernel.a.astype(dtype))
  # The scale on the [batch..., r] product: the smallest tensor here.
  h = h * jnp.asarray(kernel.scale, dtype)
  return y + jnp.einsum(out_of, h, kernel.b.astype(dtype))
