"""LoRA: low-rank adapters on chosen kernels, as extra entries of the flat
parameter dict.

For a kernel W whose first ``n_in`` axes are its inputs (``query`` [D, N, H]:
one; ``out`` [N, H, D]: two), an adapter is

  ``<kernel>.lora_a``  A [*in, r]   logical axes (*W's input axes, 'lora_rank')
  ``<kernel>.lora_b``  B [r, *out]  logical axes ('lora_rank', *W's output axes)

made as Flax's ``nnx.LoRA(in, r, out)`` makes them (A from its
``a_initializer``, B zeros, so step 0 is the base model), with the scale
``alpha / r`` of the LoRA paper and PEFT. A scanned stack ('layers.ff.wi'
[L, D, F]) gets stacked adapters ('layers.ff.wi.lora_a' [L, D, r]), so both
layer layouts convert by name as the other parameters do. 'lora_rank' is in
no sharding rule: it stays whole, the other axes shard as W's.

Two forwards, the same function of x (to float rounding):

* training (:meth:`LoraModelDef.merge_for_training`): ``x W + (alpha / r)
  (drop(x) A) B``, factored (``low_rank.project``), so the backward of a
  frozen W forms no [in, out] weight gradient and no [in, out] product
  A B: LoRA's saving in compute, besides the optimizer state and the
  checkpoints, which hold the adapters only (see ``trainable``). Dropout
  (``config.lora.dropout``, as PEFT's lora_dropout) drops A's input here
  alone;
* everything else (evaluation, decoding, export: :meth:`LoraModelDef.merge`)
  is the base model holding W + (alpha / r) A B, for every model kind and
  both layer layouts without a LoRA path in the model code.

A kernel whose projection does not go through ``low_rank.project`` (the
output head) is merged in training too.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import math
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.errors import UsageError
from jax_transformer.model.low_rank import LowRank
from jax_transformer.model.params import ModelDef, Params

A, B = 'lora_a', 'lora_b'
SUFFIXES = ('.' + A, '.' + B)
RANK_AXIS = 'lora_rank'
STACK_AXIS = 'layers'
# Names of targets that stand for kernels of other names: groups, and the
# module names of Hugging Face models (PEFT's target_modules) for the
# kernels the families' layouts map them to (interop/hf_families.py).
# GPT-2's c_attn holds query, key and value (export joins their adapters);
# its c_proj is both the attention's and the MLP's output, as PEFT matches it.
ALIASES = {'attention': ('query', 'key', 'value', 'out'),
           'mlp': ('wi', 'wi_gate', 'wo'),
           'q_proj': ('query',), 'k_proj': ('key',), 'v_proj': ('value',),
           'o_proj': ('out',), 'gate_proj': ('wi_gate',),
           'up_proj': ('wi',), 'down_proj': ('wo',),
           'c_attn': ('query', 'key', 'value'), 'c_proj': ('out', 'wo'),
           'c_fc': ('wi',)}
# Kernels whose projections take a low_rank.LowRank (the rest merge).
FACTORED = ('query', 'key', 'value', 'out', 'wi', 'wi_gate', 'wo')
# Mixed into a train step's dropout key for the adapters' dropout keys (a
# constant no nnx.Rngs counter reaches).
DROPOUT_SALT = 0x4C6F5241
DEFAULT_TARGETS = 'query,key,value,out'


def is_adapter(name: str) -> bool:
  return name.endswith(SUFFIXES)


def has_adapters(params: Mapping[str, Any]) -> bool:
  return any(is_adapter(k) for k in params)


def trainable(params: Mapping[str, Any]) -> dict[str, Any]:
  """What trains: the adapters where ``params`` holds any (the base is
  frozen), else every parameter."""
  if not has_adapters(params):
    return dict(params)
  return {k: v for k, v in params.items() if is_adapter(k)}


def frozen(params: Mapping[str, Any]) -> dict[str, Any]:
  """The parameters that do not train (``{}`` without adapters)."""
  if not has_adapters(params):
    return {}
  return {k: v for k, v in params.items() if not is_adapter(k)}


@dataclasses.dataclass(frozen=True)
class Target:
  """One adapted kernel: its name, stacked layers, inputs and outputs."""
  kernel: str
  stack: tuple[int, ...]      # leading layer axes (scanned stacks)
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  stack_axes: tuple[str, ...]
  in_axes: tuple[str, ...]
  out_axes: tuple[str, ...]

  def shapes(self, rank: int) -> dict[str, tuple[int, ...]]:
    return {f'{self.kernel}.{A}': (*self.stack, *self.in_shape, rank),
            f'{self.kernel}.{B}': (*self.stack, rank, *self.out_shape)}

  def axes(self) -> dict[str, tuple[str, ...]]:
    return {f'{self.kernel}.{A}': (*self.stack_axes, *self.in_axes,
                                   RANK_AXIS),
            f'{self.kernel}.{B}': (*self.stack_axes, RANK_AXIS,
                                   *self.out_axes)}


def parse_targets(targets: str | Sequence[str]) -> list[str]:
  """'query,key' or ['query', 'layers.*.ff.wi'] -> patterns (an alias,
  'attention' or 'mlp', stays one entry: see find_targets)."""
  if isinstance(targets, str):
    targets = targets.split(',')
  return [t for t in (str(t).strip() for t in targets) if t]


def _matches(pattern: str, name: str) -> bool:
  """A plain name ('query') matches a kernel's last component; a pattern
  with a dot or a wildcard matches the whole name (fnmatch)."""
  if '.' in pattern or any(c in pattern for c in '*?['):
    return fnmatch.fnmatchcase(name, pattern)
  return name.rsplit('.', 1)[-1] == pattern


def find_targets(shapes: Mapping[str, Sequence[int]],
                 logical_axes: Mapping[str, Sequence[str]],
                 targets: str | Sequence[str]) -> list[Target]:
  """The kernels that ``targets`` name, or UsageError in one sentence: a
  pattern that matches nothing, or matches a bias, norm or embedding."""
  patterns = parse_targets(targets)
  if not patterns:
    raise UsageError('config.lora.targets names no kernel; give e.g. '
                     f"'{DEFAULT_TARGETS}' or 'attention,mlp'.")
  found = []
  for pattern in patterns:
    # An alias matches its members that the model has (no wi_gate without
    # SwiGLU), and must match one of them.
    members = ALIASES.get(pattern, (pattern,))
    names = [n for n in shapes if not is_adapter(n)
             and any(_matches(m, n) for m in members)]
    if not names:
      raise UsageError(_unmatched(pattern, shapes, logical_axes))
    for name in names:
      axes = tuple(logical_axes[name])
      split = _kernel_axes(axes)
      if split is None:
        raise UsageError(f'config.lora.targets: {pattern!r} matches {name} '
                         f'(logical axes {axes}), which is not a kernel (a '
                         'bias, norm or embedding table takes no adapter).')
      n_stack, n_in = split
      shape = tuple(shapes[name])
      found.append(Target(name, shape[:n_stack],
                          shape[n_stack:n_stack + n_in],
                          shape[n_stack + n_in:], axes[:n_stack],
                          axes[n_stack:n_stack + n_in],
                          axes[n_stack + n_in:]))
  unique = {t.kernel: t for t in found}
  return [unique[k] for k in sorted(unique)]


def _unmatched(pattern: str, shapes: Mapping[str, Sequence[int]],
               logical_axes: Mapping[str, Sequence[str]]) -> str:
  """The one-sentence refusal of a pattern that matches nothing: the
  closest valid names first, then the model's kernels."""
  kernels = sorted({n.rsplit('.', 1)[-1] for n in shapes
                    if not is_adapter(n)
                    and _kernel_axes(logical_axes[n]) is not None})
  valid = [n for n in kernels + list(ALIASES)
           if n in kernels or any(m in kernels for m in ALIASES[n])]
  close = difflib.get_close_matches(pattern, valid, n=3, cutoff=0.5)
  hint = f'did you mean {" or ".join(close)}? ' if close else ''
  return (f'config.lora.targets: {pattern!r} matches no parameter of this '
          f'model; {hint}its kernels are {", ".join(kernels)} (or the '
          f'aliases {", ".join(n for n in valid if n in ALIASES)}).')


def _kernel_axes(axes: Sequence[str]) -> tuple[int, int] | None:
  """(stacked layer axes, input axes) of a kernel's logical axes; None for
  what is not a kernel. The inputs are every axis but the last where the
  output is 'embed' (out [N, H, D], wo [F, D]), else the first."""
  n_stack = 0
  while n_stack < len(axes) and axes[n_stack] == STACK_AXIS:
    n_stack += 1
  rest = tuple(axes[n_stack:])
  if len(rest) < 2 or rest[0] == 'vocab' or RANK_AXIS in rest:
    return None
  return n_stack, (len(rest) - 1 if rest[-1] == 'embed' else 1)


def delta(a: jax.Array, b: jax.Array, target: Target,
          scale: float) -> jax.Array:
  """scale * A B in the kernel's shape, in float32."""
  stack, r = target.stack, a.shape[-1]
  a2 = a.astype(jnp.float32).reshape(*stack, math.prod(target.in_shape), r)
  b2 = b.astype(jnp.float32).reshape(*stack, r, math.prod(target.out_shape))
  d = jnp.matmul(a2, b2, precision=jax.lax.Precision.HIGHEST)
  return (scale * d).reshape(*stack, *target.in_shape, *target.out_shape)


def merged(params: Mapping[str, jax.Array], targets: Sequence[Target],
           scale: float) -> Params:
  """The base parameters with every adapter folded in: W + scale A B
  (computed in float32, cast to W's dtype); adapters dropped."""
  out = {k: v for k, v in params.items() if not is_adapter(k)}
  for t in targets:
    w = out[t.kernel]
    d = delta(params[f'{t.kernel}.{A}'], params[f'{t.kernel}.{B}'], t, scale)
    out[t.kernel] = (w.astype(jnp.float32) + d).astype(w.dtype)
  return out


def factored(params: Mapping[str, jax.Array], targets: Sequence[Target],
             scale: float, dropout: float = 0.0,
             key: jax.Array | None = None) -> dict[str, Any]:
  """The base parameters with each adapted kernel of FACTORED as a
  low_rank.LowRank (W, A, B and, with dropout and a key, its own dropout
  key: one per layer of a stack), the others merged; adapters dropped."""
  factor = [t for t in targets if t.kernel.rsplit('.', 1)[-1] in FACTORED]
  out = merged(params, [t for t in targets if t not in factor], scale)
  for i, t in enumerate(factor):
    t_key = None
    if dropout and key is not None:
      t_key = jax.random.fold_in(jax.random.fold_in(key, DROPOUT_SALT), i)
      if t.stack:
        t_key = jax.random.split(t_key, math.prod(t.stack)).reshape(t.stack)
    out[t.kernel] = LowRank(out[t.kernel], params[f'{t.kernel}.{A}'],
                            params[f'{t.kernel}.{B}'], t_key, scale, dropout)
  return out


@dataclasses.dataclass(frozen=True, eq=False)
class LoraModelDef(ModelDef):
  """A ModelDef whose parameters also hold adapters: ``merge`` builds the
  base module holding the merged kernels, ``merge_for_training`` the one
  applying them factored (see the module docstring)."""
  targets: tuple[Target, ...] = ()
  rank: int = 0
  alpha: float = 0.0
  dropout: float = 0.0

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def merge(self, params: Params) -> nnx.Module:
    return super().merge(merged(params, self.targets, self.scale))

  def merge_for_training(self, params: Params, key: jax.Array
                         ) -> nnx.Module:
    return super().merge(factored(params, self.targets, self.scale,
                                  self.dropout, key))

  @property
  def logical_axes(self) -> dict[str, tuple[str, ...]]:
    axes = dict(super().logical_axes)
    for t in self.targets:
      axes.update(t.axes())
    return axes

  def abstract_adapters(self, dtype=jnp.float32
                        ) -> dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct(s, dtype) for t in self.targets
            for k, s in t.shapes(self.rank).items()}

  def init_adapters(self, key: jax.Array, dtype=jnp.float32) -> Params:
    """Fresh adapters as ``nnx.LoRA`` initialises them (A from its
    a_initializer, B zeros), one key per kernel (per layer of a stack)."""
    out = {}
    for i, t in enumerate(self.targets):
      n_in, n_out = math.prod(t.in_shape), math.prod(t.out_shape)

      def one(k, t=t, n_in=n_in, n_out=n_out):
        lora = nnx.LoRA(n_in, self.rank, n_out, param_dtype=dtype,
                        rngs=nnx.Rngs(params=k))
        return lora.lora_a[...], lora.lora_b[...]

      keys = jax.random.split(jax.random.fold_in(key, i),
                              math.prod(t.stack) or 1)
      a, b = jax.vmap(one)(keys)
      names = list(t.shapes(self.rank))
      shapes = t.shapes(self.rank)
      out[names[0]] = a.reshape(shapes[names[0]])
      out[names[1]] = b.reshape(shapes[names[1]])
    return out


def apply(config: Any, model_def: ModelDef, abstract_params: Params
          ) -> tuple[ModelDef, Params]:
  """The model with adapters on the targets of config (``config.lora``:
  rank, alpha, targets, dropout); unchanged with rank 0."""
  if not config.rank:
    return model_def, abstract_params
  return with_adapters(model_def, abstract_params, config.rank, config.alpha,
                       config.targets, config.dropout)


def with_adapters(model_def: ModelDef, abstract_params: Params, rank: int,
                  alpha: float, targets: str | Sequence[str],
                  dropout: float = 0.0) -> tuple[LoraModelDef, Params]:
  """(the LoRA model definition, abstract params with the adapters added)
  for a model's definition and abstract parameters."""
  if rank < 1:
    raise UsageError(f'config.lora.rank must be 0 (off) or positive, got '
                     f'{rank}.')
  if not alpha or alpha <= 0:
    raise UsageError(f'config.lora.alpha must be positive, got {alpha}.')
  if not 0.0 <= dropout < 1.0:
    raise UsageError(f'config.lora.dropout must be in [0, 1), got '
                     f'{dropout}.')
  found = find_targets({k: v.shape for k, v in abstract_params.items()},
                       model_def.logical_axes, targets)
  lora_def = LoraModelDef(model_def.graphdef, model_def.variables,
                          tuple(found), int(rank), float(alpha),
                          float(dropout))
  return lora_def, {**abstract_params, **lora_def.abstract_adapters()}


def count(params: Mapping[str, Any]) -> tuple[int, int]:
  """(trainable, total) parameter counts."""
  total = sum(math.prod(v.shape) for v in params.values())
  return sum(math.prod(v.shape) for v in trainable(params).values()), total
