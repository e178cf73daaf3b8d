"""Parameters to and from PyTorch ``state_dict`` layouts (numpy only).

Two layouts:
  * the reference encoder-decoder (``torch_reference.TorchTransformer``:
    ``embed`` + ``nn.Transformer(batch_first=True)`` + ``head``);
  * Hugging Face's ``GPT2LMHeadModel`` for the decoder-only model.

Each layout is a table of :class:`Entry` rows, one per PyTorch tensor, that
names the JAX parameters it is made of and how to convert both ways. Loading
checks every key and shape before building anything.

Beside the tensors: the reference model's constructor arguments
(:func:`reference_kwargs`) and the Hugging Face ``GPT2Config`` of a GPT-2-shaped
model, both ways (:func:`gpt2_hf_config`, :func:`model_fields_from_gpt2`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_transformer.model import params as params_lib
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM, EncoderDecoder

Arrays = Sequence[np.ndarray]


@dataclasses.dataclass(frozen=True)
class Entry:
  """One PyTorch tensor and the JAX parameters (dotted paths) it holds."""
  torch_key: str
  jax_paths: tuple[str, ...]
  to_torch: Callable[[Arrays], np.ndarray]
  from_torch: Callable[[np.ndarray], list[np.ndarray]]


def _same(key: str, path: str) -> Entry:
  return Entry(key, (path,), lambda a: a[0], lambda t: [t])


def _matrix(key: str, path: str, shape: tuple[int, ...], in_axes: int = 1,
            transpose: bool = True) -> Entry:
  """A kernel of ``shape`` (its first ``in_axes`` axes are inputs) stored as
  a torch matrix: [out, in] for nn.Linear (transpose), [in, out] for Conv1D.
  """
  n_in = int(np.prod(shape[:in_axes]))

  def to_torch(arrays):
    m = arrays[0].reshape(n_in, -1)
    return m.T if transpose else m

  def from_torch(t):
    return [(t.T if transpose else t).reshape(shape)]

  return Entry(key, (path,), to_torch, from_torch)


def _joined(key: str, paths: tuple[str, ...], shape: tuple[int, ...],
            transpose: bool) -> Entry:
  """One torch tensor made of equal JAX kernels ``shape`` joined along the
  output features, e.g. in_proj_weight = [q; k; v] or GPT-2's c_attn.

  Kernels [D, N, H] are flattened to [D, N*H] (biases [N, H] to [N*H]),
  concatenated along the last axis, then transposed for nn.Linear.
  """
  def to_torch(arrays):
    flat = [a.reshape(shape[0], -1) if len(shape) == 3 else a.reshape(-1)
            for a in arrays]
    joined = jnp.concatenate(flat, axis=-1)
    return joined.T if transpose else joined

  def from_torch(t):
    parts = np.split(t.T if transpose else t, len(paths), axis=-1)
    return [p.reshape(shape) for p in parts]

  return Entry(key, paths, to_torch, from_torch)


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


def _norm_entries(torch_prefix: str, jax_prefix: str) -> list[Entry]:
  return [_same(f'{torch_prefix}.weight', f'{jax_prefix}.scale'),
          _same(f'{torch_prefix}.bias', f'{jax_prefix}.bias')]


def _head_entry(name: str, c: ModelConfig) -> Entry:
  """The output head: the token embedding where tied, else its own matrix."""
  if c.tie_embeddings:
    return _same(name, 'embed.embedding')
  return _matrix(name, 'head', (c.d_model, c.vocab_size))


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
# Hugging Face GPT-2 layout.

# Buffers (not parameters) that some GPT-2 checkpoints carry.
_GPT2_BUFFERS = ('.attn.bias', '.attn.masked_bias')
# Our activation -> transformers' activation_function, and back.
_GPT2_ACTIVATIONS = {'gelu_tanh': 'gelu_new', 'gelu': 'gelu', 'relu': 'relu'}
_FROM_GPT2_ACTIVATIONS = {'gelu_new': 'gelu_tanh',
                          'gelu_pytorch_tanh': 'gelu_tanh', 'gelu': 'gelu',
                          'relu': 'relu'}
# GPT2Config's flags this layout has one value of.
_GPT2_FIXED = {'scale_attn_weights': True,
               'scale_attn_by_inverse_layer_idx': False,
               'add_cross_attention': False}


def _check_gpt2_config(c: ModelConfig) -> None:
  wanted = dict(positional='learned', norm_first=True, norm='layernorm',
                use_bias=True, final_norm=True, scale_embeddings=False)
  wrong = [f'{k}={getattr(c, k)!r} (GPT-2 has {v!r})'
           for k, v in wanted.items() if getattr(c, k) != v]
  if c.kv_heads != c.num_heads:
    wrong.append('grouped-query attention (GPT-2 has num_kv_heads = '
                 'num_heads)')
  if c.activation == 'swiglu':
    wrong.append("activation='swiglu' (GPT-2 has a plain MLP)")
  if wrong:
    raise ValueError('The GPT-2 layout cannot hold ' + '; '.join(wrong) + '.')


def gpt2_entries(c: ModelConfig) -> list[Entry]:
  """The name/shape table of a Hugging Face GPT2LMHeadModel state_dict."""
  _check_gpt2_config(c)
  d, n, h = c.d_model, c.num_heads, c.head_dim
  entries = [_same('transformer.wte.weight', 'embed.embedding'),
             _same('transformer.wpe.weight', 'position_embed.embedding')]
  for i in range(c.num_decoder_layers):
    tp, jp = f'transformer.h.{i}', f'layers.{i}'
    qkv = tuple(f'{jp}.self_attn.{x}' for x in ('query', 'key', 'value'))
    # Conv1D stores [in, out]: no transposes, only reshapes.
    entries += [
        _joined(f'{tp}.attn.c_attn.weight', qkv, (d, n, h), transpose=False),
        _joined(f'{tp}.attn.c_attn.bias', tuple(p + '_bias' for p in qkv),
                (n, h), transpose=False),
        _matrix(f'{tp}.attn.c_proj.weight', f'{jp}.self_attn.out', (n, h, d),
                in_axes=2, transpose=False),
        _same(f'{tp}.attn.c_proj.bias', f'{jp}.self_attn.out_bias'),
        _same(f'{tp}.mlp.c_fc.weight', f'{jp}.ff.wi'),
        _same(f'{tp}.mlp.c_fc.bias', f'{jp}.ff.bi'),
        _same(f'{tp}.mlp.c_proj.weight', f'{jp}.ff.wo'),
        _same(f'{tp}.mlp.c_proj.bias', f'{jp}.ff.bo'),
    ]
    entries += _norm_entries(f'{tp}.ln_1', f'{jp}.self_attn_norm')
    entries += _norm_entries(f'{tp}.ln_2', f'{jp}.ff_norm')
  entries += _norm_entries('transformer.ln_f', 'norm')
  return entries + [_head_entry('lm_head.weight', c)]


def gpt2_hf_config(c: ModelConfig, *, bos_id: int | None = None,
                   eos_id: int | None = None,
                   pad_id: int | None = None) -> dict[str, Any]:
  """The Hugging Face ``GPT2Config`` (as a dict) of a GPT-2-shaped model:
  ``GPT2LMHeadModel(GPT2Config(**d))`` holds :func:`decoder_lm_to_gpt2`."""
  _check_gpt2_config(c)
  return dict(
      model_type='gpt2', architectures=['GPT2LMHeadModel'],
      vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model,
      n_layer=c.num_decoder_layers, n_head=c.num_heads, n_inner=c.d_ff,
      activation_function=_GPT2_ACTIVATIONS[c.activation],
      layer_norm_epsilon=c.layer_norm_eps, resid_pdrop=c.dropout_rate,
      embd_pdrop=c.dropout_rate, attn_pdrop=c.attention_dropout_rate,
      tie_word_embeddings=c.tie_embeddings, reorder_and_upcast_attn=False,
      bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
      **_GPT2_FIXED)


def model_fields_from_gpt2(hf: Mapping[str, Any]
                           ) -> tuple[dict[str, Any], list[str]]:
  """(ModelConfig fields, what this layout cannot hold) of a GPT2Config dict
  (a Hugging Face config.json; missing keys take GPT2Config's defaults)."""
  unsupported = [f'{k}={hf[k]!r}' for k, v in _GPT2_FIXED.items()
                 if hf.get(k, v) != v]
  activation = hf.get('activation_function', 'gelu_new')
  if activation not in _FROM_GPT2_ACTIVATIONS:
    unsupported.append(f'activation_function={activation!r}')
  d = hf.get('n_embd', 768)
  fields = dict(
      vocab_size=hf.get('vocab_size', 50257),
      max_len=hf.get('n_positions', 1024), d_model=d,
      num_heads=hf.get('n_head', 12), num_decoder_layers=hf.get('n_layer', 12),
      d_ff=hf.get('n_inner') or 4 * d,
      activation=_FROM_GPT2_ACTIVATIONS.get(activation, activation),
      layer_norm_eps=hf.get('layer_norm_epsilon', 1e-5),
      tie_embeddings=hf.get('tie_word_embeddings', True),
      # Fixed by the layout (see _check_gpt2_config).
      num_encoder_layers=0, positional='learned', norm_first=True,
      norm='layernorm', use_bias=True, final_norm=True,
      scale_embeddings=False)
  return fields, unsupported


def with_gpt2_prefix(state_dict: Mapping[str, Any]) -> dict[str, Any]:
  """GPT2LMHeadModel keys for a state dict saved from GPT2Model (``wte.weight``
  instead of ``transformer.wte.weight``, as on the original hub files)."""
  if 'wte.weight' not in state_dict:
    return dict(state_dict)
  return {k if k.startswith('lm_head.') else f'transformer.{k}': v
          for k, v in state_dict.items()}


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
  problems = []
  provided = set()
  for e in entries:
    abstract = [jax.ShapeDtypeStruct(shapes[p], np.float32)
                for p in e.jax_paths]
    expected = tuple(jax.eval_shape(e.to_torch, abstract).shape)
    if e.torch_key not in state_dict:
      # A tied head is often left out of saved checkpoints.
      if not set(e.jax_paths) <= provided:
        problems.append(f'missing key {e.torch_key!r} (expected shape '
                        f'{expected})')
      continue
    provided.update(e.jax_paths)
    got = tuple(np.shape(state_dict[e.torch_key]))
    if got != expected:
      problems.append(f'key {e.torch_key!r} has shape {got} but the model '
                      f'expects {expected}')
  known = {e.torch_key for e in entries}
  for key in state_dict:
    if key not in known and not key.endswith(ignored_suffixes):
      problems.append(f'unexpected key {key!r} with shape '
                      f'{tuple(np.shape(state_dict[key]))}')
  if problems:
    raise ValueError('State dict does not match the model:\n  ' +
                     '\n  '.join(problems))


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
