"""Memory before compute: what one train step holds on each device.

Before compiling, the pre-flight report adds per device the parameters, the
optimizer state and the gradients (exact: abstract shapes and the shardings
the trainer plans) and an *estimate* of the activations the backward pass
keeps. After compiling, XLA's own figure (``compiled.memory_analysis()``) is
the authoritative one. A run that will not fit the device's memory
(``config.device_memory_gb``, or built in for the device kind) is refused in
one sentence, before its first step, so before any checkpoint of a new step
is written.

Sizes are bytes; GB in messages and in ``device_memory_gb`` is 10^9 bytes.

The activation estimate follows the accounting of Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models" (section 4):
per layer, each tensor the backward pass must read, at its dtype. Their GPT
layer keeps s*b*h*(34 + 5*a*s/h) bytes at 16 bits; here the count is
written tensor by tensor (``_attention``, ``_feed_forward``), because this
codebase's layer differs from Megatron's:
  - attention probabilities [B, N, T, S] are kept by XLA's attention (the
    float32 softmax, plus its cast copy below float32) and by the explicit
    path attention dropout needs (float32 softmax, keep mask, dropped
    weights); a fused kernel (cuDNN) keeps none;
  - dropout also acts on the feed-forward hidden layer, and SwiGLU keeps a
    third F-wide tensor; 'hash' dropout keeps no masks at all (XLA
    re-derives the bits in the backward pass: the compiled step's
    temporaries are the same with dropout on and off);
  - the logits are float32 [B, T, V] plus their gradient, 8 V bytes per
    token, unless the loss is chunked (``config.loss_chunk_size`` rows).
For their layer (16-bit, threefry dropout, F = 4D, explicit attention) this
gives s*b*h*(38 + 7*a*s/h): their 34 plus the hidden layer's mask, their 5
with a float32 softmax. Tensor parallelism divides the head- and F-wide
tensors and the logits by the 'tensor' axis, as in Megatron; D-wide tensors
count whole. The 'sequence' axis divides every tensor of a token by its
size, except the keys and values (gathered whole for attention); the
probabilities [B, N, T, S] lose T's share only.

The estimate counts only what the backward pass must keep, so it errs low:
a refusal before compiling is sure, and XLA's figure catches the rest. Not
counted: the attention masks and the batch (bytes per token, once),
gradients of activations in flight during the backward pass, and
intermediates XLA keeps rather than recomputes (XLA:CPU keeps attention's
scores beside its probabilities and GELU's pieces: there activations plus
gradients come to 0.6x-0.8x of XLA's temporaries, see tests/test_memory.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jax_transformer.errors import UsageError
from jax_transformer.experiment import StepShape
from jax_transformer.model import attention, sharding
from jax_transformer.model.config import ModelConfig

GB = 1e9
_GIB = 2 ** 30

# Memory per chip by jax.Device.device_kind, in bytes. Vendor figures:
# NVIDIA's datasheets (H100 SXM/PCIe 80 GB, H100 NVL 94 GB, H200 141 GB,
# A100 40 GB and 80 GB) and Google Cloud's TPU pages (v4 32 GiB, v5e
# 16 GiB, v5p 95 GiB, v6e 32 GiB of HBM per chip). A key matches when each
# of its words occurs in the lower-cased kind, e.g. 'NVIDIA A100-SXM4-80GB'.
DEVICE_MEMORY = {
    'h100': 80 * GB, 'h100 nvl': 94 * GB, 'h800': 80 * GB,
    'h200': 141 * GB, 'a100': 40 * GB, 'a100 80gb': 80 * GB,
    'tpu v4': 32 * _GIB, 'tpu v5 lite': 16 * _GIB, 'tpu v5e': 16 * _GIB,
    'tpu v5': 95 * _GIB, 'tpu v5p': 95 * _GIB, 'tpu v6 lite': 32 * _GIB,
    'tpu v6e': 32 * _GIB,
}

ADVICE = 'lower batch_size, turn on model.remat or add devices'


def builtin_memory(device_kind: str) -> int | None:
  """Bytes of one device of this kind (``jax.devices()[0].device_kind``);
  None when unknown (CPUs)."""
  kind = device_kind.lower()
  # The longest matching key is the most specific: 'a100 80gb' over 'a100'.
  found = [k for k in DEVICE_MEMORY if all(w in kind for w in k.split())]
  return int(DEVICE_MEMORY[max(found, key=len)]) if found else None


def readable(n: float) -> str:
  """Bytes as a short figure: 93.1 GB, 812.0 MB, 14.2 kB, 12 B."""
  for unit, scale in (('GB', GB), ('MB', 1e6), ('kB', 1e3)):
    if n >= scale:
      return f'{n / scale:.1f} {unit}'
  return f'{int(n)} B'


@dataclasses.dataclass(frozen=True)
class Budget:
  """The memory of one device (None: unknown) and where that figure came
  from, as the end of a sentence."""
  bytes: int | None
  source: str

  @classmethod
  def of(cls, configured: float | None,
         device_kind: str | None = None) -> 'Budget':
    """``configured`` (config.device_memory_gb) when set, else the built-in
    figure for the device kind (default: that of this process's first
    device)."""
    if configured is not None:
      return cls(int(configured * GB),
                 f'config.device_memory_gb is {configured:g}')
    kind = device_kind or jax.devices()[0].device_kind
    found = builtin_memory(kind)
    return cls(found, f'each {kind} has {readable(found)}' if found
               else f'the memory of a {kind} is not built in')

  def share(self, needed: int) -> str:
    if self.bytes is None:
      return 'device memory unknown (config.device_memory_gb sets it)'
    return f'{needed / self.bytes:.0%} of the device ({self.source})'

  def check(self, needed: int, what: str) -> None:
    """Refuses, in one sentence, a step that needs more than the device
    has; ``what`` says the figure and its parts."""
    if self.bytes is not None and needed > self.bytes:
      raise UsageError(f'{what} but {self.source}; {ADVICE}.')


@dataclasses.dataclass(frozen=True)
class Footprint:
  """Bytes per device of one train step, known before compiling."""
  parameters: int
  optimizer_state: int
  gradients: int
  activations: int
  gathered: int = 0  # FSDP: parameters gathered whole for their use

  @property
  def total(self) -> int:
    return (self.parameters + self.optimizer_state + self.gradients
            + self.activations + self.gathered)

  def parts(self) -> str:
    gathered = (f', gathered parameters {readable(self.gathered)}'
                if self.gathered else '')
    return (f'parameters {readable(self.parameters)}, optimizer state '
            f'{readable(self.optimizer_state)}, gradients '
            f'{readable(self.gradients)}, activations (estimated) '
            f'{readable(self.activations)}{gathered}')


@dataclasses.dataclass(frozen=True)
class Compiled:
  """XLA's buffer sizes for one device of a compiled step, in bytes."""
  arguments: int
  outputs: int
  temporaries: int
  aliased: int

  @classmethod
  def of(cls, compiled) -> 'Compiled | None':
    """From a ``jax.stages.Compiled``; None when the backend gives none."""
    try:
      stats = compiled.memory_analysis()
    except (NotImplementedError, jax.errors.JaxRuntimeError):
      return None
    if stats is None:
      return None
    return cls(stats.argument_size_in_bytes, stats.output_size_in_bytes,
               stats.temp_size_in_bytes, stats.alias_size_in_bytes)

  @property
  def total(self) -> int:
    # A donated argument's buffer is reused for an output: count it once.
    return self.arguments + self.outputs + self.temporaries - self.aliased

  def parts(self) -> str:
    return (f'arguments {readable(self.arguments)}, temporaries '
            f'{readable(self.temporaries)}, outputs '
            f'{readable(self.outputs)}, less {readable(self.aliased)} '
            'donated')


def state_bytes(abstract_state: dict[str, Any], shardings: dict[str, Any]
                ) -> tuple[int, int]:
  """(parameter bytes, bytes of the rest of the state: optimizer state,
  step and key) on one device, from ShapeDtypeStructs and NamedShardings."""
  def total(tree, tree_shardings) -> int:
    return sum(jax.tree.leaves(jax.tree.map(
        lambda x, s: sharding.bytes_per_device(x.shape, x.dtype, s.spec,
                                               s.mesh),
        tree, tree_shardings)))
  rest = [k for k in abstract_state if k != 'params']
  return (total(abstract_state['params'], shardings['params']),
          total({k: abstract_state[k] for k in rest},
                {k: shardings[k] for k in rest}))


def _element_bytes(mc: ModelConfig) -> tuple[int, int]:
  """(bytes of a compute-dtype element, bytes of a residual or hidden
  dropout keep-mask element: 1 for threefry dropout, else 0)."""
  kept_mask = mc.dropout_rate > 0 and mc.dropout_rng != 'hash'
  return mc.compute_dtype.itemsize, int(kept_mask)


def _probability_bytes(mc: ModelConfig) -> int:
  """Bytes kept per attention-probability element [B, N, T, S]."""
  c = mc.compute_dtype.itemsize
  if mc.attention_dropout_rate > 0:
    # The explicit path: float32 softmax, keep mask, dropped weights.
    return 4 + 1 + c
  # attention.implementation resolves 'auto'; where it is absent the
  # config names the backend itself.
  pick = getattr(attention, 'implementation', None)
  chosen = (pick(mc, mc.compute_dtype) if pick
            else mc.attention_implementation)
  if chosen in ('cudnn', 'splash'):
    return 0  # a fused kernel keeps only per-row softmax statistics
  # XLA's path: the float32 softmax and, below float32, its cast copy.
  return 4 + (c if c < 4 else 0)


def _attention(mc: ModelConfig, tensor: int, queries: int, keys: int,
               kv_tokens: int) -> tuple[float, float]:
  """(bytes kept, of which matmul outputs) by one attention sublayer over
  ``queries`` query tokens that each see ``keys`` keys, keys and values
  projected from ``kv_tokens`` tokens."""
  c, m = _element_bytes(mc)
  q_width = mc.num_heads * mc.head_dim
  kv_width = 2 * mc.kv_heads * mc.head_dim
  # Norm input, projection input, residual dropout mask: D wide, whole.
  stream = (2 * c + m) * mc.d_model * queries
  # Queries and the context (the output projection's input); keys, values.
  heads = (2 * c * q_width * queries + c * kv_width * kv_tokens) / tensor
  probs = _probability_bytes(mc) * mc.num_heads * keys * queries / tensor
  # Under remat 'dots': the q, k, v and output projections.
  dots = (c * (q_width * queries + kv_width * kv_tokens) / tensor
          + c * mc.d_model * queries)
  return stream + heads + probs, dots


def _feed_forward(mc: ModelConfig, tensor: int, tokens: int
                  ) -> tuple[float, float]:
  """(bytes kept, of which matmul outputs) by one feed-forward sublayer."""
  c, m = _element_bytes(mc)
  gated = mc.activation == 'swiglu'
  stream = (2 * c + m) * mc.d_model * tokens
  # The pre-activation and wo's (dropped) input, SwiGLU's gate, the
  # hidden layer's dropout mask.
  hidden = ((3 if gated else 2) * c + m) * mc.d_ff * tokens / tensor
  dots = ((2 if gated else 1) * c * mc.d_ff * tokens / tensor
          + c * mc.d_model * tokens)
  return stream + hidden, dots


def _stack(layer: tuple[float, float], count: int, layer_input: float,
           remat: str) -> float:
  """Bytes kept by ``count`` identical layers under a remat policy."""
  kept, dots = layer
  if count == 0:
    return 0.0
  if remat == 'none':
    return count * kept
  saved = layer_input + (dots if remat == 'dots' else 0.0)
  # One layer's activations exist again while its backward pass runs.
  return count * saved + kept


def _sum(*parts: tuple[float, float]) -> tuple[float, float]:
  return sum(p[0] for p in parts), sum(p[1] for p in parts)


def activation_bytes(mc: ModelConfig, batch: int, tgt_len: int,
                     src_len: int = 0, tensor: int = 1,
                     loss_rows: int | None = None, sequence: int = 1) -> int:
  """Estimated bytes of activations one device keeps for the backward pass
  (see the module docstring for what is counted).

  batch: rows B per device; tgt_len: T (the LM's sequence length);
  src_len: S of an encoder-decoder (0: a decoder LM); tensor: the 'tensor'
  mesh axis; loss_rows: token rows per device in one chunk of a chunked
  loss (None or 0: the whole [B, T, V] logits); sequence: the 'sequence'
  mesh axis, which splits each row's positions (its queries) while every
  device keeps the whole row's keys and values, gathered for attention.
  """
  c, m = _element_bytes(mc)
  d = mc.d_model
  # Tokens a device holds, and the whole rows its attention reads.
  tgt, src = batch * tgt_len // sequence, batch * src_len // sequence
  tgt_rows, src_rows = batch * tgt_len, batch * src_len
  encoder = _sum(_attention(mc, tensor, src, src_len, src_rows),
                 _feed_forward(mc, tensor, src))
  cross = (_attention(mc, tensor, tgt, src_len, src_rows) if src_len
           else (0, 0))
  decoder = _sum(_attention(mc, tensor, tgt, tgt_len, tgt_rows), cross,
                 _feed_forward(mc, tensor, tgt))
  layers = (_stack(encoder, mc.num_encoder_layers, c * d * src, mc.remat)
            + _stack(decoder, mc.num_decoder_layers, c * d * tgt, mc.remat))
  # Embedding dropout masks; each stack's final norm input and output (the
  # encoder's output is the memory every cross-attention reads).
  ends = (m + 2 * c) * d * (src + tgt)
  # float32 logits and their gradient; V is split over 'tensor'.
  logits = 2 * 4 * mc.vocab_size * min(loss_rows or tgt, tgt) / tensor
  return int(layers + ends + logits)


def estimate(shape: StepShape, loss_chunk_size: int,
             model_config: ModelConfig, abstract_state: dict[str, Any],
             shardings: dict[str, Any], mesh: jax.sharding.Mesh) -> Footprint:
  """The per-device footprint of a train step of ``shape`` (loss chunked
  by ``loss_chunk_size`` rows, 0: whole), before compiling (``shardings``
  as ``steps.state_shardings`` plans them)."""
  params, rest = state_bytes(abstract_state, shardings)
  shards = mesh.shape['data'] * mesh.shape['fsdp']
  sequence = mesh.shape.get('sequence', 1)
  # A loss chunk takes rows from the whole batch and every position: each
  # device holds its share.
  acts = activation_bytes(model_config, shape.batch_size // shards,
                          shape.seq_len, shape.source_len,
                          mesh.shape['tensor'],
                          -(-loss_chunk_size // (shards * sequence)),
                          sequence)
  # Gradients have the parameters' shapes, dtypes and shardings.
  return Footprint(params, rest, params, acts,
                   gathered_bytes(model_config, mesh))


def gathered_bytes(mc: ModelConfig, mesh: jax.sharding.Mesh) -> int:
  """Bytes of parameters FSDP gathers whole at once, per device: one
  layer's weights (the layer running) and the token embedding twice (the
  lookup or tied head, and its gradient before it is scattered back).
  Fitted to the TPU compiler's figures (docs/scaling.md): 0.88-1.2x."""
  if mesh.shape['fsdp'] == 1:
    return 0
  p = jnp.dtype(mc.param_dtype).itemsize
  q_width = mc.num_heads * mc.head_dim
  kv_width = 2 * mc.kv_heads * mc.head_dim
  mlp = (3 if mc.activation == 'swiglu' else 2) * mc.d_model * mc.d_ff
  layer = mc.d_model * (2 * q_width + kv_width) + mlp
  embedding = mc.vocab_size * mc.d_model
  return int(p * (layer + 2 * embedding) / mesh.shape['tensor'])


def preflight(footprint: Footprint, budget: Budget) -> str:
  """The pre-flight memory line, after refusing a run whose footprint does
  not fit ``budget``."""
  total = readable(footprint.total)
  budget.check(footprint.total, f'The run needs about {total} per device '
               f'({footprint.parts()})')
  return (f'Memory per device before compiling: {footprint.parts()}; '
          f'about {total}, {budget.share(footprint.total)}.')


def after_compile(compiled, budget: Budget, footprint: Footprint) -> str:
  """XLA's figure for ``compiled`` (a ``jax.stages.Compiled``) as a log
  line, after refusing a step that does not fit ``budget``."""
  figure = Compiled.of(compiled)
  if figure is None:
    return 'Memory per device: XLA gives no figure on this backend.'
  total = readable(figure.total)
  budget.check(figure.total, f'The compiled train step needs {total} per '
               f'device ({figure.parts()})')
  return (f'Memory per device, XLA\'s figure for the compiled train step: '
          f'{total} ({figure.parts()}), {budget.share(figure.total)}; the '
          f'estimate was {footprint.total / max(figure.total, 1):.2f}x '
          'of it.')
