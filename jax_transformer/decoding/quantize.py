"""Lower-precision copies of a model for decoding: bfloat16 compute, and
int8 weight-only matmul kernels.

Both return a new model of the same class; the original is left as it is.

* :func:`cast`: the config's ``dtype`` and ``param_dtype`` set to, say,
  bfloat16 and every float parameter cast once. Matmuls then run in
  bfloat16 and the KV cache follows the compute dtype (``_empty_cache``);
  norms, softmax and logits stay float32 inside the modules.
* :func:`int8`: each matmul kernel (attention query/key/value/out,
  feed-forward wi/wi_gate/wo, an untied head) is held as an
  :class:`Int8Kernel`, int8 values with one float32 scale per output
  channel. Embeddings, positions, norms and biases keep their dtype (so a
  tied head stays float too).

How int8 stays out of the model code: the modules read every parameter as
``variable[...]``, which NNX answers with ``value[...]``. An
:class:`Int8Kernel` is a pytree (int8 values and scales travel through
``nnx.split``, ``jax.jit`` and ``lax.scan`` over stacked layers like any
parameter) whose ``[...]`` returns the dequantised kernel,
``values.astype(float32) * scale``. So the dequantisation is traced where the
kernel is used, inside each decoding step, and the step's inputs are the
int8 arrays. Whether a compiler keeps it there is its choice: see
docs/decoding.md for what XLA does on CPU.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.errors import UsageError

Array = jax.Array

DTYPES = ('float32', 'bfloat16')
WEIGHTS = ('int8',)

# The logical axes each matmul kernel contracts, by parameter name (the
# einsums in attention.py, layers.py and models.py). A scale per output
# channel is a max over exactly these axes; any others (heads, a scanned
# stack's 'layers') keep their own scales.
CONTRACTED = {
    'query': ('embed',),             # BTD,DNH->BTNH
    'key': ('embed',),               # BSD,DKH->BSKH
    'value': ('embed',),
    'out': ('heads', 'head_dim'),    # BTNH,NHD->BTD
    'wi': ('embed',),                # MD,DF->MF (rows: B*T)
    'wi_gate': ('embed',),
    'wo': ('mlp',),                  # MF,FD->MD
    'head': ('embed',),              # BTD,DV->BTV
}
_INT8_MAX = 127  # symmetric: -128 is never used, so negation is exact


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Kernel:
  """A matmul kernel as int8 values and per-output-channel scales.

  values: int8, the kernel's shape. scale: float32, the kernel's shape with
  size 1 on the contracted axes. ``kernel[...]`` (how the modules read a
  parameter) is ``values * scale`` in float32; the modules then cast it to
  their compute dtype.
  """

  values: Array
  scale: Array

  @classmethod
  def quantize(cls, w: Array, axes: tuple[int, ...]) -> 'Int8Kernel':
    """Rounds w to the nearest multiple of its channel's scale,
    max|w| / 127 over ``axes``, so every entry is off by at most scale/2."""
    w = w.astype(jnp.float32)
    peak = jnp.max(jnp.abs(w), axis=axes, keepdims=True)
    # An all-zero channel stays zero whatever its scale; 1 avoids 0 / 0.
    scale = jnp.where(peak > 0, peak / _INT8_MAX, 1.0)
    values = jnp.clip(jnp.round(w / scale), -_INT8_MAX, _INT8_MAX)
    return cls(values.astype(jnp.int8), scale)

  def dequantize(self) -> Array:
    return self.values.astype(self.scale.dtype) * self.scale

  def __getitem__(self, index) -> Array:
    return self.dequantize()[index]

  @property
  def shape(self) -> tuple[int, ...]:
    return self.values.shape

  @property
  def dtype(self):
    return self.scale.dtype

  @property
  def ndim(self) -> int:
    return self.values.ndim


def _contracted_axes(name: str, variable: nnx.Variable) -> tuple[int, ...]:
  """Positions of the kernel's contracted axes, from its logical names."""
  names = variable.get_metadata().get('out_sharding') or ()
  axes = tuple(i for i, n in enumerate(names) if n in CONTRACTED[name])
  if len(axes) != len(CONTRACTED[name]):
    raise ValueError(f'Cannot quantize {name!r}: its logical axes {names} '
                     f'lack {CONTRACTED[name]}.')
  return axes


def _is_kernel(path, variable: nnx.Variable) -> bool:
  value = variable.get_value()
  return (isinstance(variable, nnx.Param) and path[-1] in CONTRACTED
          and isinstance(value, jax.Array)
          and jnp.issubdtype(value.dtype, jnp.floating))


def _map_params(model, fn):
  """A copy of model whose variables are fn(path, variable) (a Variable)."""
  graphdef, state = nnx.split(model)
  flat = [(path, fn(path, variable))
          for path, variable in nnx.to_flat_state(state)]
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def int8(model):
  """A copy of model whose matmul kernels are :class:`Int8Kernel`s."""

  def quantize(path, variable):
    if not _is_kernel(path, variable):
      return variable
    axes = _contracted_axes(path[-1], variable)
    return variable.replace(Int8Kernel.quantize(variable.get_value(), axes))

  return _map_params(model, quantize)


def cast(model, dtype: str):
  """A copy of model computing in ``dtype``, its float parameters cast to it
  (int8 kernels keep their values and scales)."""
  config = model.config.replace(dtype=dtype, param_dtype=dtype)

  def convert(path, variable):
    del path
    value = variable.get_value()
    if (isinstance(value, jax.Array)
        and jnp.issubdtype(value.dtype, jnp.floating)
        and value.dtype != config.params_dtype):
      return variable.replace(value.astype(config.params_dtype))
    return variable

  copy = _map_params(model, convert)
  # Every module holds the model's config (frozen, so replaced, not edited);
  # the compute dtype and the cache's dtype are read from it.
  for _, node in nnx.iter_graph(copy):
    if isinstance(node, nnx.Module) and getattr(node, 'config', None) == (
        model.config):
      node.config = config
  return copy


def check(dtype: str | None, weights: str | None) -> None:
  """ValueError unless dtype and weights name something this module does."""
  if dtype is not None and dtype not in DTYPES:
    raise UsageError(f'dtype must be None or one of {DTYPES}, got '
                     f'{dtype!r}.')
  if weights is not None and weights not in WEIGHTS:
    raise UsageError(f'weights must be None or one of {WEIGHTS}, got '
                     f'{weights!r}.')


def for_decoding(model, dtype: str | None = None,
                 weights: str | None = None):
  """model as decoding should run it: ``dtype`` None keeps the config's
  compute dtype, 'bfloat16' or 'float32' casts (:func:`cast`);
  ``weights='int8'`` quantizes the matmul kernels (:func:`int8`), from the
  float weights before any cast. Returns model itself when nothing changes.
  """
  check(dtype, weights)
  if weights == 'int8':
    model = int8(model)
  if dtype is not None and (dtype != model.config.dtype
                            or dtype != model.config.param_dtype):
    model = cast(model, dtype)
  return model
