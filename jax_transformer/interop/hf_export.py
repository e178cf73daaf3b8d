"""A decoder LM as a Hugging Face model folder, streamed tensor by tensor.

``write_folder(config, params, tokenizer, out)`` writes what
``transformers.AutoModelForCausalLM.from_pretrained(out)`` loads:
``config.json`` of the family (``interop/hf_families.py``: GPT-2 for learned
positions, Qwen2 for q/k/v biases alone, Llama otherwise, or the one
asked for), the weights in float32 as ``model.safetensors`` or, above
``max_shard_bytes``, as ``model-0000k-of-0000n.safetensors`` shards with
``model.safetensors.index.json``, and the tokenizer (``tokenizer.json``,
``tokenizer_config.json``) where it has a ``transformers`` form.

Parameters may be sharded over devices and in either layer layout: each
is gathered to the host one layer at a time when its tensor is written,
and a shard file is written (and dropped) as soon as it is full, so the
host holds at most one shard plus one tensor.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
import numpy as np
from safetensors.numpy import save_file

from jax_transformer.errors import UsageError
from jax_transformer.interop import hf_families, hf_tokenizer
from jax_transformer.model import params as params_lib
from jax_transformer.model.config import ModelConfig
from jax_transformer.runtime import storage

HF_CONFIG, HF_WEIGHTS, HF_INDEX = (hf_families.HF_CONFIG,
                                   hf_families.HF_WEIGHTS,
                                   hf_families.HF_INDEX)
# transformers' own default for save_pretrained(max_shard_size='5GB').
MAX_SHARD_BYTES = 5 * 10 ** 9


def check_fits(config: ModelConfig, family: str | None = None
               ) -> hf_families.Family:
  """The family the model is written as, or UsageError naming every field
  it cannot hold."""
  chosen = hf_families.family_for(config, family)
  try:
    chosen.entries(config)
  except ValueError as e:
    raise UsageError(str(e)) from None
  return chosen


def hf_config(config: ModelConfig, tokenizer, family: str | None = None
              ) -> dict[str, Any]:
  """The config.json (a dict) of the export, with the tokenizer's own
  BOS/EOS/PAD ids."""
  chosen = check_fits(config, family)
  ids = {f'{k}_id': getattr(tokenizer, f'{k}_id', None)
         for k in ('bos', 'eos', 'pad')}
  return dict(chosen.hf_config(config, **ids), dtype='float32')


class _Gather:
  """One layer's parameter at a time, on the host, from either layout."""

  def __init__(self, params: Mapping[str, Any]):
    self._params = params
    self._scanned = {}
    for name in params:
      parts = params_lib._split_name(name)  # pylint: disable=protected-access
      if parts is not None and parts[1] is None:
        self._scanned[(parts[0], parts[2])] = name

  def __call__(self, path: str) -> np.ndarray:
    if path in self._params:
      return np.asarray(jax.device_get(self._params[path]))
    head, index, tail = params_lib._split_name(path)  # pylint: disable=protected-access
    stacked = self._params[self._scanned[(head, tail)]]
    return np.asarray(jax.device_get(stacked[int(index)]))


def write_weights(config: ModelConfig, params: Mapping[str, Any], out: str,
                  family: hf_families.Family,
                  max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
  """The weight files of the export; returns their names."""
  gather = _Gather(params)
  written: list[tuple[str, list[str]]] = []  # (temporary file, its keys)
  shard: dict[str, np.ndarray] = {}
  size = 0

  def flush():
    nonlocal shard, size
    name = os.path.join(out, f'.shard-{len(written):05d}.safetensors')
    save_file(shard, name, metadata={'format': 'pt'})
    written.append((name, list(shard)))
    shard, size = {}, 0

  for e in family.entries(config):
    if e.torch_key == 'lm_head.weight' and config.tie_embeddings:
      continue  # transformers ties it on loading
    tensor = np.asarray(e.to_torch([gather(p) for p in e.jax_paths]))
    tensor = np.ascontiguousarray(tensor, np.float32)
    if shard and size + tensor.nbytes > max_shard_bytes:
      flush()
    shard[e.torch_key] = tensor
    size += tensor.nbytes
  flush()
  total = sum(os.path.getsize(n) for n, _ in written)
  if len(written) == 1:
    os.replace(written[0][0], os.path.join(out, HF_WEIGHTS))
    return [HF_WEIGHTS]
  names, weight_map = [], {}
  for i, (temporary, keys) in enumerate(written, 1):
    name = f'model-{i:05d}-of-{len(written):05d}.safetensors'
    os.replace(temporary, os.path.join(out, name))
    names.append(name)
    weight_map.update({k: name for k in keys})
  with open(os.path.join(out, HF_INDEX), 'w') as f:
    json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map},
              f, indent=2, sort_keys=True)
  return names


def write_folder(config: ModelConfig, params: Mapping[str, Any], tokenizer,
                 out: str, family: str | None = None,
                 max_shard_bytes: int = MAX_SHARD_BYTES,
                 add_bos: bool = False) -> list[str]:
  """Writes the Hugging Face folder ``out``; returns notes (one line each).
  The tokenizer comes with its chat template and generation_config.json
  (``hf_tokenizer.save_pretrained``; add_bos: it puts BOS first, as rows
  of examples and instructions began, where a stream LM's windows did
  not)."""
  chosen = check_fits(config, family)
  notes = []
  # Written aside and moved into out at the end: a failure leaves out as
  # it was (storage.written_whole).
  with storage.written_whole(out) as partial:
    partial = os.fspath(partial)
    with open(os.path.join(partial, HF_CONFIG), 'w') as f:
      json.dump(hf_config(config, tokenizer, chosen.name), f, indent=2,
                sort_keys=True)
    write_weights(config, params, partial, chosen, max_shard_bytes)
    converted = hf_tokenizer.to_huggingface(tokenizer)
    if converted is None:
      notes.append(f'The {tokenizer.kind} tokenizer has no transformers form '
                   f'here, so {out} holds the model only (the workdir\'s '
                   'tokenizer/ has it for the sentencepiece library).')
    else:
      hf_tokenizer.save_pretrained(converted, partial, add_bos=add_bos,
                                   trained=tokenizer)
    for name in os.listdir(out) if os.path.isdir(out) else ():
      # An earlier export's shards would mix in with these.
      if name.startswith('model') and name.endswith(('.safetensors',
                                                     '.json')):
        os.remove(os.path.join(out, name))
  return notes


# ----------------------------------------------------------------------------
# LoRA adapters as a PEFT folder.

ADAPTER_CONFIG, ADAPTER_WEIGHTS = ('adapter_config.json',
                                   'adapter_model.safetensors')


def _module(torch_key: str) -> str:
  return torch_key.rsplit('.', 1)[0]


def adapter_tensors(config: ModelConfig, params: Mapping[str, Any],
                    lora_def, family: hf_families.Family
                    ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
  """({PEFT key: tensor}, {module: rank where it is not lora_def.rank}).

  PEFT's delta of a module is lora_B @ lora_A * alpha / r (transposed for
  GPT-2's Conv1D, fan_in_fan_out): lora_A [r, in] is our A [in, r]
  flattened and transposed, lora_B [out, r] our B likewise. A tensor
  holding several kernels (GPT-2's c_attn: q, k, v) gets their adapters
  side by side, of rank r times the number adapted, B block-diagonal (zero
  where a kernel has no adapter), so its delta is theirs exactly.
  """
  gather = _Gather(params)
  kernels = {t.kernel for t in lora_def.targets}
  r = lora_def.rank
  tensors, ranks = {}, {}
  for e in family.entries(config):
    adapted = [p for p in e.jax_paths if p in kernels]
    if not adapted:
      continue
    a_parts, b_parts = [], []
    outs = [int(np.prod(_out_shape(p, lora_def))) for p in e.jax_paths]
    for i, path in enumerate(e.jax_paths):
      if path not in kernels:
        continue
      a = gather(f'{path}.lora_a')
      b = gather(f'{path}.lora_b')
      a_parts.append(a.reshape(-1, r))
      block = np.zeros((r, sum(outs)), np.float32)
      block[:, sum(outs[:i]):sum(outs[:i + 1])] = b.reshape(r, -1)
      b_parts.append(block)
    module = _module(e.torch_key)
    tensors[f'base_model.model.{module}.lora_A.weight'] = np.ascontiguousarray(
        np.concatenate(a_parts, axis=1).T, np.float32)
    tensors[f'base_model.model.{module}.lora_B.weight'] = np.ascontiguousarray(
        np.concatenate(b_parts, axis=0).T, np.float32)
    if len(adapted) > 1:
      ranks[module] = r * len(adapted)
  return tensors, ranks


def _out_shape(kernel: str, lora_def) -> tuple[int, ...]:
  """A kernel's output shape (its Target's, or, for a kernel of a joined
  tensor without an adapter, its adapted sibling's: q, k and v of GPT-2's
  c_attn have one shape)."""
  by_name = {t.kernel: t for t in lora_def.targets}
  if kernel in by_name:
    return by_name[kernel].out_shape
  head = kernel.rsplit('.', 1)[0]
  siblings = [t for k, t in by_name.items() if k.rsplit('.', 1)[0] == head]
  return siblings[0].out_shape


def write_adapter(config: ModelConfig, params: Mapping[str, Any], lora_def,
                  out: str, base_model: str | None = None,
                  family: str | None = None) -> list[str]:
  """Writes the adapters of a LoRA run (``params``: the base and the
  adapters, unrolled or scanned) as a PEFT folder ``out``:
  ``adapter_config.json`` + ``adapter_model.safetensors``, which
  ``peft.PeftModel.from_pretrained(base, out)`` loads onto the base model
  (``base_model``: its folder or id, written as base_model_name_or_path).
  Returns notes."""
  chosen = check_fits(config, family)
  if any(t.stack for t in lora_def.targets):  # scanned: one layer each
    lora_def = _unrolled_def(lora_def, params)
  tensors, ranks = adapter_tensors(config, params, lora_def, chosen)
  if not tensors:
    raise UsageError('None of the adapted kernels is a tensor of the '
                     f'{chosen.name} layout.')
  # Whole module names: PEFT matches a bare 'c_proj' to GPT-2's attention
  # and MLP projections both.
  names = sorted({k.split('base_model.model.', 1)[1].rsplit('.lora_', 1)[0]
                  for k in tensors})
  alpha = lora_def.alpha
  config_json = {
      'peft_type': 'LORA', 'task_type': 'CAUSAL_LM',
      'base_model_name_or_path': base_model, 'r': lora_def.rank,
      'lora_alpha': alpha, 'lora_dropout': 0.0, 'bias': 'none',
      'target_modules': names, 'fan_in_fan_out': chosen.name == 'gpt2',
      'inference_mode': True, 'modules_to_save': None,
      'init_lora_weights': True, 'use_rslora': False, 'use_dora': False,
      # Joined tensors (c_attn) hold several adapters: a larger rank, the
      # same scale alpha / r.
      'rank_pattern': dict(ranks),
      'alpha_pattern': {m: alpha * k / lora_def.rank
                        for m, k in ranks.items()},
  }
  with storage.written_whole(out) as partial:
    with open(os.path.join(partial, ADAPTER_CONFIG), 'w') as f:
      json.dump(config_json, f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(partial, ADAPTER_WEIGHTS),
              metadata={'format': 'pt'})
  return []


def _unrolled_def(lora_def, params=None):
  """lora_def's targets one layer at a time (for a scanned stack)."""
  del params
  targets = []
  for t in lora_def.targets:
    if not t.stack:
      targets.append(t)
      continue
    head, _, tail = params_lib._split_name(t.kernel)  # pylint: disable=protected-access
    for i in range(t.stack[0]):
      targets.append(dataclasses.replace(
          t, kernel=f'{head}.{i}.{tail}', stack=(), stack_axes=()))
  return dataclasses.replace(lora_def, targets=tuple(targets))
