"""Architecture hyperparameters: one frozen dataclass, validated on
construction."""

from __future__ import annotations

import dataclasses
from typing import Literal

# numpy's dtypes are jax.numpy's; ml_dtypes (JAX's own) names bfloat16 for
# numpy. Not JAX: a config file reads this module, and train.py reads the
# config before JAX starts (``--aot_target`` starts it for a target's
# compiler, ``runtime/targets.start``).
import ml_dtypes  # noqa: F401
import numpy as np

from jax_transformer import fields
from jax_transformer.errors import UsageError

Activation = Literal['relu', 'gelu', 'gelu_tanh', 'swiglu']
Positional = Literal['sinusoidal', 'learned', 'rotary']
Norm = Literal['layernorm', 'rmsnorm']
RopeScaling = Literal['none', 'llama3']

_DTYPES = ('float32', 'bfloat16', 'float16')
REMAT_POLICIES = ('none', 'full', 'dots')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of an encoder-decoder or decoder-only Transformer.

  Names follow the paper and PyTorch's ``nn.Transformer``. The defaults are
  the paper's base model (``nn.Transformer``'s defaults plus a shared 37000
  vocabulary, sinusoidal positions and a tied head).
  """

  # None only in an experiment's config.model, before its tokenizer is
  # known (``Experiment.model_config`` fills it in); a model needs a size.
  vocab_size: int | None = 37000
  d_model: int = 512
  num_heads: int = 8
  # Key/value heads for grouped-query attention; None means num_heads (MHA).
  num_kv_heads: int | None = None
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  d_ff: int = 2048
  # Residual, embedding and feed-forward dropout (the paper's P_drop).
  dropout_rate: float = 0.1
  # Dropout on attention weights, as nn.MultiheadAttention(dropout=...).
  attention_dropout_rate: float = 0.1
  activation: Activation = 'relu'
  # False: post-norm (the paper, PyTorch's default); True: pre-norm.
  norm_first: bool = False
  norm: Norm = 'layernorm'
  # nn.Transformer always normalises the output of each stack.
  final_norm: bool = True
  positional: Positional = 'sinusoidal'
  max_len: int = 512
  rope_base: float = 10000.0
  # Rotary frequencies rescaled for long contexts: 'none', or 'llama3'
  # (Llama 3.1's: wavelengths above original_max_len / low_freq_factor
  # slowed by factor, below original_max_len / high_freq_factor kept, a
  # smooth blend between). The four numbers below matter only with it.
  rope_scaling: RopeScaling = 'none'
  rope_scaling_factor: float = 8.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  # Output projection shares the token embedding (the paper, Press & Wolf).
  tie_embeddings: bool = True
  # Multiply embeddings by sqrt(d_model) (the paper); GPT-2 does not.
  scale_embeddings: bool = True
  use_bias: bool = True
  # Biases on the query, key and value projections even without use_bias
  # (Qwen2: q/k/v biased, output projection and feed-forward not).
  qkv_bias: bool = False
  layer_norm_eps: float = 1e-5
  # Compute dtype of matmuls; norms, softmax and logits stay float32.
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  # Attention backend: 'auto' (the Pallas splash kernel on a TPU, cuDNN on
  # a GPU when the dtype is 16-bit and the head width allows, XLA
  # otherwise), 'xla', 'cudnn', 'splash' (interpreted off a TPU: slow, for
  # tests), or None (jax.nn.dot_product_attention's own default).
  attention_implementation: str | None = 'auto'
  # Where dropout's random bits come from: 'hash' (a counter hash seeded
  # per call from the step's key: cheap to run and to compile) or
  # 'threefry' (jax.random.bernoulli, as before). Same keep rate either way.
  dropout_rng: str = 'hash'
  # Stack each layer kind's parameters on a leading 'layers' axis and run
  # the stack with lax.scan: compile time stops growing with depth.
  scan_layers: bool = False
  # Rematerialisation of each layer in the backward pass: 'none' (keep all
  # activations), 'full' (keep only each layer's input), 'dots' (keep the
  # outputs of matmuls without batch dimensions, recompute the rest).
  remat: str = 'none'

  def __post_init__(self):
    for problem in self._problems():
      raise UsageError(f'ModelConfig: {problem}')

  def _problems(self):
    positive = ('vocab_size', 'd_model', 'num_heads', 'd_ff', 'max_len')
    for name in positive:
      value = getattr(self, name)
      if name == 'vocab_size' and value is None:
        continue
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        yield str(fields.not_an_integer(name, value))
    for name in ('num_encoder_layers', 'num_decoder_layers'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        yield f'{name} must be a non-negative integer, got {value!r}.'
    if self.d_model % self.num_heads:
      yield (f'd_model={self.d_model} is not divisible by '
             f'num_heads={self.num_heads}.')
    kv = self.kv_heads
    if not isinstance(kv, int) or kv <= 0 or self.num_heads % kv:
      yield (f'num_kv_heads={self.num_kv_heads} must be a positive divisor of '
             f'num_heads={self.num_heads}.')
    for name in ('dropout_rate', 'attention_dropout_rate'):
      value = getattr(self, name)
      if not 0.0 <= value < 1.0:
        yield f'{name} must be in [0, 1), got {value!r}.'
    if self.activation not in Activation.__args__:
      yield (f'activation={self.activation!r} is not one of '
             f'{Activation.__args__}.')
    if self.positional not in Positional.__args__:
      yield (f'positional={self.positional!r} is not one of '
             f'{Positional.__args__}.')
    if self.norm not in Norm.__args__:
      yield f'norm={self.norm!r} is not one of {Norm.__args__}.'
    if self.positional == 'rotary' and self.head_dim % 2:
      yield f'rotary positions need an even head width, got {self.head_dim}.'
    if self.positional == 'sinusoidal' and self.d_model % 2:
      yield f'sinusoidal positions need an even d_model, got {self.d_model}.'
    for name in ('dtype', 'param_dtype'):
      if getattr(self, name) not in _DTYPES:
        yield f'{name}={getattr(self, name)!r} is not one of {_DTYPES}.'
    if self.dropout_rng not in ('hash', 'threefry'):
      yield ("dropout_rng must be 'hash' or 'threefry', got "
             f'{self.dropout_rng!r}.')
    if self.remat not in REMAT_POLICIES:
      yield f'remat must be one of {REMAT_POLICIES}, got {self.remat!r}.'
    if not isinstance(self.scan_layers, bool):
      yield f'scan_layers must be True or False, got {self.scan_layers!r}.'
    if self.attention_implementation not in (None, 'auto', 'xla', 'cudnn',
                                             'splash'):
      yield ('attention_implementation must be "auto", "xla", "cudnn", '
             '"splash" or None, got '
             f'{self.attention_implementation!r}.')
    if (self.attention_implementation == 'cudnn'
        and self.dtype not in ('bfloat16', 'float16')):
      yield ("attention_implementation='cudnn' needs dtype 'bfloat16' or "
             f"'float16' (cuDNN attention has no float32), got {self.dtype!r}.")
    if self.rope_scaling not in RopeScaling.__args__:
      yield (f'rope_scaling={self.rope_scaling!r} is not one of '
             f'{RopeScaling.__args__}.')
    elif self.rope_scaling == 'llama3' and not (
        self.rope_scaling_factor > 0 and self.rope_original_max_len > 0
        and 0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
      yield ('rope_scaling=\'llama3\' needs rope_scaling_factor > 0, '
             'rope_original_max_len > 0 and 0 < rope_low_freq_factor < '
             'rope_high_freq_factor.')
    if not isinstance(self.qkv_bias, bool):
      yield f'qkv_bias must be True or False, got {self.qkv_bias!r}.'
    if self.layer_norm_eps <= 0:
      yield f'layer_norm_eps must be positive, got {self.layer_norm_eps!r}.'

  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def has_qkv_bias(self) -> bool:
    return self.use_bias or self.qkv_bias

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def compute_dtype(self) -> np.dtype:
    return np.dtype(self.dtype)

  @property
  def params_dtype(self) -> np.dtype:
    return np.dtype(self.param_dtype)

  def replace(self, **changes) -> 'ModelConfig':
    return dataclasses.replace(self, **changes)


def small_lm(**overrides) -> ModelConfig:
  """The default decoder-only LM: pre-norm, rotary positions, GELU, no
  biases, a tied head, dropout on residuals only."""
  fields = dict(d_model=128, num_heads=4, num_encoder_layers=0,
                num_decoder_layers=4, d_ff=512, attention_dropout_rate=0.0,
                activation='gelu', norm_first=True, positional='rotary',
                max_len=256, scale_embeddings=False, use_bias=False)
  return ModelConfig(**{**fields, **overrides})


def transformer_base(**overrides) -> ModelConfig:
  """The paper's base model: 63,084,544 parameters with a tied 37000 vocab."""
  return ModelConfig(**overrides)


def transformer_big(**overrides) -> ModelConfig:
  """The paper's big model (d_model 1024, 16 heads, d_ff 4096, dropout 0.3)."""
  fields = dict(d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3,
                attention_dropout_rate=0.3)
  return ModelConfig(**{**fields, **overrides})


def gpt2_small(**overrides) -> ModelConfig:
  """A decoder-only model shaped like GPT-2 small (124M parameters)."""
  fields = dict(vocab_size=50257, d_model=768, num_heads=12,
                num_encoder_layers=0, num_decoder_layers=12, d_ff=3072,
                activation='gelu_tanh', norm_first=True, positional='learned',
                max_len=1024, scale_embeddings=False, dropout_rate=0.1,
                attention_dropout_rate=0.1)
  return ModelConfig(**{**fields, **overrides})


PRESETS = {
    'transformer_base': transformer_base,
    'transformer_big': transformer_big,
    'gpt2_small': gpt2_small,
}
