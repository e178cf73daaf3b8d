"""Hugging Face decoder families: one mapping table per family, both ways.

A family is the ``config.json`` of a ``transformers`` causal LM read as
:class:`ModelConfig` fields (refusing, in one sentence naming the field,
what the model cannot express), the same written back, and the table of
its ``state_dict``: one :class:`Entry` per tensor naming the JAX parameters
it holds and how to convert both ways.

  gpt2     GPT2LMHeadModel: learned positions, pre-norm LayerNorm, biases,
           GELU, a fused c_attn (Conv1D, stored [in, out]).
  llama    LlamaForCausalLM (Llama 2 and 3, with Llama 3's rope_scaling):
           rotary positions, RMSNorm, SwiGLU, grouped-query attention, no
           biases (attention_bias puts them on q, k, v and o).
  mistral  MistralForCausalLM: Llama's layout, without a sliding window
           in effect.
  qwen2    Qwen2ForCausalLM: Llama's layout with biases on q, k and v only.

It lives with the model (numpy and the config only) so that the trainer's
``init_from`` (``train/init_from.py``) and ``interop`` both read it; the
PyTorch reference encoder-decoder's layout stays in
``interop/torch_compat.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_transformer.errors import UsageError
from jax_transformer.model.config import ModelConfig

# The files of a Hugging Face model folder that hold its config and weights
# (the index names the shards of a sharded set).
HF_CONFIG, HF_WEIGHTS = 'config.json', 'model.safetensors'
HF_INDEX = HF_WEIGHTS + '.index.json'

Arrays = Sequence[np.ndarray]


@dataclasses.dataclass(frozen=True)
class Entry:
  """One PyTorch tensor and the JAX parameters (dotted paths) it holds."""
  torch_key: str
  jax_paths: tuple[str, ...]
  to_torch: Callable[[Arrays], np.ndarray]
  from_torch: Callable[[np.ndarray], list[np.ndarray]]


def same(key: str, path: str) -> Entry:
  return Entry(key, (path,), lambda a: a[0], lambda t: [t])


def reshaped(key: str, path: str, shape: tuple[int, ...]) -> Entry:
  """A JAX array of ``shape`` stored flat (e.g. a bias [N, H] as [N*H])."""
  return Entry(key, (path,), lambda a: a[0].reshape(-1),
               lambda t: [t.reshape(shape)])


def matrix(key: str, path: str, shape: tuple[int, ...], in_axes: int = 1,
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


def joined(key: str, paths: tuple[str, ...], shape: tuple[int, ...],
           transpose: bool) -> Entry:
  """One torch tensor made of equal JAX kernels ``shape`` joined along the
  output features, e.g. in_proj_weight = [q; k; v] or GPT-2's c_attn.

  Kernels [D, N, H] are flattened to [D, N*H] (biases [N, H] to [N*H]),
  concatenated along the last axis, then transposed for nn.Linear.
  """
  def to_torch(arrays):
    flat = [a.reshape(shape[0], -1) if len(shape) == 3 else a.reshape(-1)
            for a in arrays]
    out = jnp.concatenate(flat, axis=-1)
    return out.T if transpose else out

  def from_torch(t):
    parts = np.split(t.T if transpose else t, len(paths), axis=-1)
    return [p.reshape(shape) for p in parts]

  return Entry(key, paths, to_torch, from_torch)


def norm_entries(torch_prefix: str, jax_prefix: str) -> list[Entry]:
  return [same(f'{torch_prefix}.weight', f'{jax_prefix}.scale'),
          same(f'{torch_prefix}.bias', f'{jax_prefix}.bias')]


def head_entry(name: str, c: ModelConfig) -> Entry:
  """The output head: the token embedding where tied, else its own matrix."""
  if c.tie_embeddings:
    return same(name, 'embed.embedding')
  return matrix(name, 'head', (c.d_model, c.vocab_size))


def check_tensors(tensors: Mapping[str, tuple[int, ...]],
                  entries: list[Entry], shapes: Mapping[str, tuple],
                  ignored_suffixes: tuple[str, ...] = ()) -> None:
  """Raises one ValueError listing every missing, unexpected or misshapen
  key of a state dict given as {key: shape}; ``shapes`` are the JAX
  parameters' (layers one by one)."""
  problems = []
  provided = set()
  for e in entries:
    abstract = [jax.ShapeDtypeStruct(shapes[p], np.float32)
                for p in e.jax_paths]
    expected = tuple(jax.eval_shape(e.to_torch, abstract).shape)
    if e.torch_key not in tensors:
      # A tied head is often left out of saved checkpoints.
      if not set(e.jax_paths) <= provided:
        problems.append(f'missing key {e.torch_key!r} (expected shape '
                        f'{expected})')
      continue
    provided.update(e.jax_paths)
    got = tuple(tensors[e.torch_key])
    if got != expected:
      problems.append(f'key {e.torch_key!r} has shape {got} but the model '
                      f'expects {expected}')
  known = {e.torch_key for e in entries}
  for key, shape in tensors.items():
    if key not in known and not key.endswith(ignored_suffixes):
      problems.append(f'unexpected key {key!r} with shape {tuple(shape)}')
  if problems:
    raise ValueError('State dict does not match the model:\n  ' +
                     '\n  '.join(problems))


# ----------------------------------------------------------------------------
# GPT-2.

# Buffers (not parameters) that some GPT-2 checkpoints carry.
GPT2_BUFFERS = ('.attn.bias', '.attn.masked_bias')
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
  entries = [same('transformer.wte.weight', 'embed.embedding'),
             same('transformer.wpe.weight', 'position_embed.embedding')]
  for i in range(c.num_decoder_layers):
    tp, jp = f'transformer.h.{i}', f'layers.{i}'
    qkv = tuple(f'{jp}.self_attn.{x}' for x in ('query', 'key', 'value'))
    # Conv1D stores [in, out]: no transposes, only reshapes.
    entries += [
        joined(f'{tp}.attn.c_attn.weight', qkv, (d, n, h), transpose=False),
        joined(f'{tp}.attn.c_attn.bias', tuple(p + '_bias' for p in qkv),
               (n, h), transpose=False),
        matrix(f'{tp}.attn.c_proj.weight', f'{jp}.self_attn.out', (n, h, d),
               in_axes=2, transpose=False),
        same(f'{tp}.attn.c_proj.bias', f'{jp}.self_attn.out_bias'),
        same(f'{tp}.mlp.c_fc.weight', f'{jp}.ff.wi'),
        same(f'{tp}.mlp.c_fc.bias', f'{jp}.ff.bi'),
        same(f'{tp}.mlp.c_proj.weight', f'{jp}.ff.wo'),
        same(f'{tp}.mlp.c_proj.bias', f'{jp}.ff.bo'),
    ]
    entries += norm_entries(f'{tp}.ln_1', f'{jp}.self_attn_norm')
    entries += norm_entries(f'{tp}.ln_2', f'{jp}.ff_norm')
  entries += norm_entries('transformer.ln_f', 'norm')
  return entries + [head_entry('lm_head.weight', c)]


def gpt2_hf_config(c: ModelConfig, *, bos_id: int | None = None,
                   eos_id: int | None = None,
                   pad_id: int | None = None) -> dict[str, Any]:
  """The Hugging Face ``GPT2Config`` (as a dict) of a GPT-2-shaped model:
  ``GPT2LMHeadModel(GPT2Config(**d))`` holds its :func:`gpt2_entries`."""
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
# Llama, Mistral, Qwen2: one layout, three configs.

_LLAMA_LIKE = {'llama': 'LlamaForCausalLM', 'mistral': 'MistralForCausalLM',
               'qwen2': 'Qwen2ForCausalLM'}
_ROPE_TYPES = ('default', 'llama3')


def _rope(hf: Mapping[str, Any]) -> dict[str, Any]:
  """The rotary settings, from transformers 5's rope_parameters or the
  older rope_theta + rope_scaling (what hub files hold)."""
  rope = {'rope_theta': hf.get('rope_theta', 10000.0),
          **(hf.get('rope_scaling') or {}), **(hf.get('rope_parameters') or {})}
  rope.setdefault('rope_type', rope.get('type', 'default'))
  return rope


def _sliding_window(hf: Mapping[str, Any], family: str) -> int | None:
  """The window in effect (None: every layer attends to all positions)."""
  window = hf.get('sliding_window')
  if family == 'qwen2':
    sliding = hf.get('use_sliding_window', False) or (
        'sliding_attention' in (hf.get('layer_types') or ()))
    window = window if sliding else None
  elif family == 'llama':
    window = None
  if window is None or window >= hf.get('max_position_embeddings', 0):
    return None
  return window


def llama_like_fields(hf: Mapping[str, Any], family: str
                      ) -> tuple[dict[str, Any], list[str]]:
  """(ModelConfig fields, what the model cannot express) of a Llama,
  Mistral or Qwen2 config.json."""
  unsupported = []
  d, n = hf['hidden_size'], hf['num_attention_heads']
  act = hf.get('hidden_act', 'silu')
  if act != 'silu':
    unsupported.append(f'hidden_act={act!r} (the gated feed-forward here is '
                       'SwiGLU: silu only)')
  if hf.get('mlp_bias'):
    unsupported.append('mlp_bias=True (SwiGLU here has no biases)')
  head_dim = hf.get('head_dim')
  if head_dim is not None and head_dim != d // n:
    unsupported.append(f'head_dim={head_dim} (here hidden_size / '
                       f'num_attention_heads = {d // n})')
  window = _sliding_window(hf, family)
  if window is not None:
    unsupported.append(f'sliding_window={window} (below '
                       f'max_position_embeddings: a window in effect)')
  rope = _rope(hf)
  if rope['rope_type'] not in _ROPE_TYPES:
    unsupported.append(f'rope_type={rope["rope_type"]!r} (only '
                       f'{" and ".join(map(repr, _ROPE_TYPES))})')
  bias = bool(hf.get('attention_bias', False)) if family == 'llama' else False
  fields = dict(
      vocab_size=hf['vocab_size'], d_model=d, num_heads=n,
      num_kv_heads=hf.get('num_key_value_heads') or n,
      num_encoder_layers=0, num_decoder_layers=hf['num_hidden_layers'],
      d_ff=hf['intermediate_size'], activation='swiglu', norm_first=True,
      norm='rmsnorm', final_norm=True, positional='rotary',
      max_len=hf.get('max_position_embeddings', 2048),
      rope_base=float(rope['rope_theta']),
      tie_embeddings=bool(hf.get('tie_word_embeddings', False)),
      scale_embeddings=False, use_bias=bias, qkv_bias=family == 'qwen2',
      layer_norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
      rope_scaling='none')
  if rope['rope_type'] == 'llama3':
    fields.update(
        rope_scaling='llama3', rope_scaling_factor=float(rope['factor']),
        rope_low_freq_factor=float(rope['low_freq_factor']),
        rope_high_freq_factor=float(rope['high_freq_factor']),
        rope_original_max_len=int(rope['original_max_position_embeddings']))
  return fields, unsupported


def _check_llama_like(c: ModelConfig, family: str) -> None:
  wanted = dict(positional='rotary', norm_first=True, norm='rmsnorm',
                final_norm=True, scale_embeddings=False, activation='swiglu',
                num_encoder_layers=0)
  if family == 'qwen2':
    wanted.update(use_bias=False, qkv_bias=True)
  elif family == 'mistral':
    wanted.update(use_bias=False, qkv_bias=False)
  wrong = [f'{k}={getattr(c, k)!r} ({family} has {v!r})'
           for k, v in wanted.items() if getattr(c, k) != v]
  if family == 'llama' and c.qkv_bias and not c.use_bias:
    wrong.append('qkv_bias=True without use_bias (Llama biases q, k, v and '
                 'o together; Qwen2 has q, k, v only)')
  if family != 'llama' and c.rope_scaling != 'none':
    wrong.append(f'rope_scaling={c.rope_scaling!r} (Llama 3 only here)')
  if wrong:
    raise ValueError(f'The {family} layout cannot hold ' + '; '.join(wrong)
                     + '.')


def llama_like_entries(c: ModelConfig, family: str) -> list[Entry]:
  """The name/shape table of a LlamaForCausalLM, MistralForCausalLM or
  Qwen2ForCausalLM state_dict (nn.Linear: [out, in])."""
  _check_llama_like(c, family)
  d, n, k, h, f = (c.d_model, c.num_heads, c.kv_heads, c.head_dim, c.d_ff)
  entries = [same('model.embed_tokens.weight', 'embed.embedding')]
  for i in range(c.num_decoder_layers):
    tp, jp = f'model.layers.{i}', f'layers.{i}'
    for proj, name, heads in (('q', 'query', n), ('k', 'key', k),
                              ('v', 'value', k)):
      entries.append(matrix(f'{tp}.self_attn.{proj}_proj.weight',
                            f'{jp}.self_attn.{name}', (d, heads, h)))
      if c.has_qkv_bias:
        entries.append(reshaped(f'{tp}.self_attn.{proj}_proj.bias',
                                f'{jp}.self_attn.{name}_bias', (heads, h)))
    entries.append(matrix(f'{tp}.self_attn.o_proj.weight',
                          f'{jp}.self_attn.out', (n, h, d), in_axes=2))
    if c.use_bias:
      entries.append(same(f'{tp}.self_attn.o_proj.bias',
                          f'{jp}.self_attn.out_bias'))
    entries += [
        matrix(f'{tp}.mlp.gate_proj.weight', f'{jp}.ff.wi_gate', (d, f)),
        matrix(f'{tp}.mlp.up_proj.weight', f'{jp}.ff.wi', (d, f)),
        matrix(f'{tp}.mlp.down_proj.weight', f'{jp}.ff.wo', (f, d)),
        same(f'{tp}.input_layernorm.weight', f'{jp}.self_attn_norm.scale'),
        same(f'{tp}.post_attention_layernorm.weight', f'{jp}.ff_norm.scale'),
    ]
  entries.append(same('model.norm.weight', 'norm.scale'))
  return entries + [head_entry('lm_head.weight', c)]


def llama_like_hf_config(c: ModelConfig, family: str, *,
                         bos_id: int | None = None, eos_id: int | None = None,
                         pad_id: int | None = None) -> dict[str, Any]:
  """The config.json of ``family`` holding a model of config ``c``."""
  _check_llama_like(c, family)
  out = dict(
      model_type=family, architectures=[_LLAMA_LIKE[family]],
      vocab_size=c.vocab_size, hidden_size=c.d_model,
      intermediate_size=c.d_ff, num_hidden_layers=c.num_decoder_layers,
      num_attention_heads=c.num_heads, num_key_value_heads=c.kv_heads,
      head_dim=c.head_dim, hidden_act='silu',
      max_position_embeddings=c.max_len, rms_norm_eps=c.layer_norm_eps,
      rope_theta=c.rope_base, rope_scaling=None,
      tie_word_embeddings=c.tie_embeddings,
      attention_dropout=c.attention_dropout_rate,
      bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
  if c.rope_scaling == 'llama3':
    out['rope_scaling'] = dict(
        rope_type='llama3', factor=c.rope_scaling_factor,
        low_freq_factor=c.rope_low_freq_factor,
        high_freq_factor=c.rope_high_freq_factor,
        original_max_position_embeddings=c.rope_original_max_len)
  if family == 'llama':
    out.update(attention_bias=c.use_bias, mlp_bias=False, pretraining_tp=1)
  elif family == 'mistral':
    out.update(sliding_window=None)
  else:
    out.update(use_sliding_window=False, sliding_window=None,
               max_window_layers=c.num_decoder_layers)
  return out


# ----------------------------------------------------------------------------
# The families.


@dataclasses.dataclass(frozen=True)
class Family:
  """One Hugging Face decoder family, both ways."""
  name: str                 # config.json's model_type
  architecture: str         # transformers' class
  fields: Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[str]]]
  hf_config: Callable[..., dict[str, Any]]   # (c, bos_id=, eos_id=, pad_id=)
  entries: Callable[[ModelConfig], list[Entry]]
  ignored_suffixes: tuple[str, ...] = ()     # buffers some files carry


def _llama_like(name: str) -> Family:
  return Family(
      name, _LLAMA_LIKE[name], lambda hf: llama_like_fields(hf, name),
      lambda c, **ids: llama_like_hf_config(c, name, **ids),
      lambda c: llama_like_entries(c, name), ('rotary_emb.inv_freq',))


FAMILIES = {
    'gpt2': Family('gpt2', 'GPT2LMHeadModel', model_fields_from_gpt2,
                   gpt2_hf_config, gpt2_entries, GPT2_BUFFERS),
    **{name: _llama_like(name) for name in _LLAMA_LIKE},
}


def family_of(hf: Mapping[str, Any], where: str = 'config.json') -> Family:
  """The family of a config.json, or UsageError naming model_type."""
  model_type = hf.get('model_type')
  if model_type not in FAMILIES:
    raise UsageError(f'{where} has model_type={model_type!r}; the families '
                     f'that import are {", ".join(sorted(FAMILIES))}.')
  return FAMILIES[model_type]


def fields_of(hf: Mapping[str, Any], where: str = 'config.json'
              ) -> tuple[Family, dict[str, Any]]:
  """(family, ModelConfig fields) of a config.json; what the model cannot
  express is refused in one sentence naming each field."""
  family = family_of(hf, where)
  try:
    fields, unsupported = family.fields(hf)
  except KeyError as e:
    raise UsageError(f'{where} ({family.name}) has no {e.args[0]!r}.'
                     ) from None
  if unsupported:
    raise UsageError(f'{where} ({family.name}) has '
                     f'{"; ".join(unsupported)}, which this model cannot '
                     'express.')
  return family, fields


def family_for(c: ModelConfig, name: str | None = None) -> Family:
  """The family an export of ``c`` is written as: ``name``, else GPT-2 for
  learned positions, Qwen2 for q/k/v biases alone, Llama otherwise."""
  if name is None:
    if c.positional == 'learned':
      name = 'gpt2'
    elif c.qkv_bias and not c.use_bias:
      name = 'qwen2'
    else:
      name = 'llama'
  if name not in FAMILIES:
    raise UsageError(f'--family {name!r} is not one of '
                     f'{", ".join(sorted(FAMILIES))}.')
  return FAMILIES[name]
