"""Parameters to and from PyTorch ``state_dict`` layouts (numpy only).

Two layouts:
  * the reference encoder-decoder (``torch_reference.TorchTransformer``:
    ``embed`` + ``nn.Transformer(batch_first=True)`` + ``head``);
  * Hugging Face's ``GPT2LMHeadModel`` for the decoder-only model.

(GPT-2's table and the table primitives are ``model/hf_families``'s; the
Llama, Mistral and Qwen2 families are there too.) Each layout is a table
of :class:`Entry` rows, one per PyTorch tensor, that
names the JAX parameters it is made of and how to convert both ways. Loading
checks every key and shape before building anything.

Beside the tensors: the reference model's constructor arguments
(:func:`reference_kwargs`). The Hugging Face ``GPT2Config`` of a GPT-2-shaped
model, both ways, is ``hf_families``'s (``gpt2_hf_config``,
``model_fields_from_gpt2``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

# The table primitives and GPT-2's table live with the Hugging Face
# families (interop/hf_families.py), which the trainer's init_from reads too.
from jax_transformer.interop.hf_families import (
  GPT2_BUFFERS as _GPT2_BUFFERS,
)
from jax_transformer.interop.hf_families import (
  Entry,
  check_tensors,
  gpt2_entries,
)
from jax_transformer.interop.hf_families import head_entry as _head_entry
from jax_transformer.interop.hf_families import joined as _joined
from jax_transformer.interop.hf_families import matrix as _matrix
from jax_transformer.interop.hf_families import norm_entries as _norm_entries
from jax_transformer.interop.hf_families import same as _same
from jax_transformer.model import params as params_lib
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM, EncoderDecoder

Arrays = Sequence[np.ndarray]


# ----------------------------------------------------------------------------
# Reference encoder-decoder layout.


def _mha_entries(torch_prefix: str, jax_prefix: str,
                 c: ModelConfig) -> list[Entry]:
  d, n, h = c.d_model, c.num_heads, c.head_dim
  qkv = tuple(f'{jax_prefix}.{name}' for name in ('query', 'key', 'value'))
  return [
      _joined(f'{torch_prefix}.in_proj_weight', qkv, (d, n, h),
              transpose=True),
      _joined(f'{torch_prefix}.in_proj_bias',
              tuple(p + '_bias' for p in qkv), (n, h), transpose=False),
      _matrix(f'{torch_prefix}.out_proj.weight', f'{jax_prefix}.out',
              (n, h, d), in_axes=2),
      _same(f'{torch_prefix}.out_proj.bias', f'{jax_prefix}.out_bias'),
  ]


def _ff_entries(torch_prefix: str, jax_prefix: str,
                c: ModelConfig) -> list[Entry]:
  d, f = c.d_model, c.d_ff
  return [
      _matrix(f'{torch_prefix}.linear1.weight', f'{jax_prefix}.ff.wi', (d, f)),
      _same(f'{torch_prefix}.linear1.bias', f'{jax_prefix}.ff.bi'),
      _matrix(f'{torch_prefix}.linear2.weight', f'{jax_prefix}.ff.wo', (f, d)),
      _same(f'{torch_prefix}.linear2.bias', f'{jax_prefix}.ff.bo'),
  ]


def _check_reference_config(c: ModelConfig) -> None:
  unsupported = []
  if c.kv_heads != c.num_heads:
    unsupported.append('grouped-query attention (num_kv_heads != num_heads)')
  if c.positional != 'sinusoidal':
    unsupported.append(f'positional={c.positional!r}')
  if c.activation not in ('relu', 'gelu', 'gelu_tanh'):
    unsupported.append(f'activation={c.activation!r}')
  if c.norm != 'layernorm' or not c.use_bias or not c.final_norm:
    unsupported.append('norms/biases other than nn.Transformer\'s')
  if not c.scale_embeddings:
    unsupported.append('unscaled embeddings')
  if unsupported:
    raise ValueError('The PyTorch reference layout (nn.Transformer) cannot '
                     'hold ' + ', '.join(unsupported) + '.')


def reference_kwargs(c: ModelConfig) -> dict[str, Any]:
  """``TorchTransformer(**reference_kwargs(c))`` is c's reference twin."""
  return dict(vocab_size=c.vocab_size, d_model=c.d_model, nhead=c.num_heads,
              num_encoder_layers=c.num_encoder_layers,
              num_decoder_layers=c.num_decoder_layers,
              dim_feedforward=c.d_ff, dropout=c.dropout_rate,
              activation=c.activation, norm_first=c.norm_first,
              layer_norm_eps=c.layer_norm_eps,
              tie_embeddings=c.tie_embeddings)


def encoder_decoder_entries(c: ModelConfig) -> list[Entry]:
  """The name/shape table of the reference model's state_dict."""
  _check_reference_config(c)
  entries = [_same('embed.weight', 'embed.embedding')]
  for i in range(c.num_encoder_layers):
    tp, jp = f'transformer.encoder.layers.{i}', f'encoder_layers.{i}'
    entries += _mha_entries(f'{tp}.self_attn', f'{jp}.self_attn', c)
    entries += _ff_entries(tp, jp, c)
    entries += _norm_entries(f'{tp}.norm1', f'{jp}.self_attn_norm')
    entries += _norm_entries(f'{tp}.norm2', f'{jp}.ff_norm')
  entries += _norm_entries('transformer.encoder.norm', 'encoder_norm')
  for i in range(c.num_decoder_layers):
    tp, jp = f'transformer.decoder.layers.{i}', f'decoder_layers.{i}'
    entries += _mha_entries(f'{tp}.self_attn', f'{jp}.self_attn', c)
    entries += _mha_entries(f'{tp}.multihead_attn', f'{jp}.cross_attn', c)
    entries += _ff_entries(tp, jp, c)
    entries += _norm_entries(f'{tp}.norm1', f'{jp}.self_attn_norm')
    entries += _norm_entries(f'{tp}.norm2', f'{jp}.cross_attn_norm')
    entries += _norm_entries(f'{tp}.norm3', f'{jp}.ff_norm')
  entries += _norm_entries('transformer.decoder.norm', 'decoder_norm')
  return entries + [_head_entry('head.weight', c)]


# ----------------------------------------------------------------------------
# Conversion, shared by both layouts.


def _to_numpy(value) -> np.ndarray:
  """A torch tensor (without importing torch) or array-like as numpy."""
  if hasattr(value, 'detach'):
    value = value.detach().cpu()
    if str(value.dtype) == 'torch.bfloat16':
      value = value.float()
    value = value.numpy()
  return np.asarray(value)


def export_state_dict(model: nnx.Module,
                      entries: list[Entry]) -> dict[str, np.ndarray]:
  """The model's parameters as a torch-layout dict of numpy arrays (either
  layer layout: entries name layers one by one)."""
  params = params_lib.unrolled(params_lib.split(model)[1])
  return {e.torch_key: np.asarray(e.to_torch([params[p] for p in e.jax_paths]))
          for e in entries}


def _check_state_dict(state_dict: Mapping[str, np.ndarray],
                      entries: list[Entry], shapes: dict[str, tuple],
                      ignored_suffixes: tuple[str, ...]) -> None:
  """Raises one error listing every missing, unexpected or misshapen key."""
  check_tensors({k: tuple(np.shape(v)) for k, v in state_dict.items()},
                entries, shapes, ignored_suffixes)


def import_state_dict(state_dict: Mapping[str, object],
                      build: Callable[[], nnx.Module], entries: list[Entry],
                      dtype=jnp.float32,
                      ignored_suffixes: tuple[str, ...] = ()) -> nnx.Module:
  """Builds the module ``build()`` holding the tensors of ``state_dict``.

  ``build`` is only traced (``nnx.eval_shape``): nothing is initialised.
  Entries name layers one by one; a scanned ``build()`` gets them stacked.
  """
  state_dict = {k: _to_numpy(v) for k, v in state_dict.items()}
  model_def, abstract = params_lib.abstract(build)
  shapes = {k: v.shape for k, v in params_lib.unrolled(abstract).items()}
  _check_state_dict(state_dict, entries, shapes, ignored_suffixes)
  values: dict[str, np.ndarray] = {}
  for e in entries:
    if e.torch_key not in state_dict:
      continue
    for path, array in zip(e.jax_paths, e.from_torch(state_dict[e.torch_key])):
      if path in values and not np.array_equal(values[path], array):
        raise ValueError(f'{e.torch_key!r} differs from the tensor already '
                         f'loaded into {path!r}, but the config ties them.')
      values[path] = array
  values = {k: jnp.asarray(v, dtype) for k, v in values.items()}
  if params_lib.is_scanned(abstract):
    values = params_lib.scanned(values)
  return model_def.merge(values)


def module_from_flat(flat: Mapping[str, object],
                     build: Callable[[], nnx.Module],
                     dtype=jnp.float32) -> nnx.Module:
  """The module ``build()`` holding its own flat parameter dict (the keys of
  ``params.split``, in either layer layout), checked key by key like a
  state dict."""
  _, abstract = params_lib.abstract(build)
  return import_state_dict(params_lib.unrolled(dict(flat)), build,
                           [_same(k, k)
                            for k in params_lib.unrolled(abstract)], dtype)


def encoder_decoder_from_torch(state_dict: Mapping[str, object],
                               config: ModelConfig) -> EncoderDecoder:
  """An EncoderDecoder from the reference model's ``state_dict()``."""
  return import_state_dict(state_dict, lambda: EncoderDecoder(config),
                           encoder_decoder_entries(config),
                           config.params_dtype)


def encoder_decoder_to_torch(model: EncoderDecoder) -> dict[str, np.ndarray]:
  """The reference model's state_dict (numpy) for an EncoderDecoder.

  Load with ``ref.load_state_dict({k: torch.from_numpy(v) ...})``.
  """
  return export_state_dict(model, encoder_decoder_entries(model.config))


def decoder_lm_from_gpt2(state_dict: Mapping[str, object],
                         config: ModelConfig) -> DecoderLM:
  """A DecoderLM from a Hugging Face ``GPT2LMHeadModel.state_dict()``."""
  return import_state_dict(state_dict, lambda: DecoderLM(config),
                           gpt2_entries(config), config.params_dtype,
                           _GPT2_BUFFERS)


def decoder_lm_to_gpt2(model: DecoderLM) -> dict[str, np.ndarray]:
  """A Hugging Face GPT-2 state_dict (numpy) for a GPT-2-shaped DecoderLM."""
  return export_state_dict(model, gpt2_entries(model.config))
