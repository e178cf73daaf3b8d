"""A decoder LM as a Hugging Face model folder, streamed tensor by tensor.

``write_folder(config, params, tokenizer, out)`` writes what
``transformers.AutoModelForCausalLM.from_pretrained(out)`` loads:
``config.json`` of the family (``model/hf_families.py``: GPT-2 for learned
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

import json
import os
from typing import Any, Mapping

import jax
import numpy as np
from safetensors.numpy import save_file

from jax_transformer.errors import UsageError
from jax_transformer.interop import hf_tokenizer
from jax_transformer.model import hf_families
from jax_transformer.model import params as params_lib
from jax_transformer.model.config import ModelConfig

HF_CONFIG, HF_WEIGHTS = 'config.json', 'model.safetensors'
HF_INDEX = HF_WEIGHTS + '.index.json'
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
                 max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
  """Writes the Hugging Face folder ``out``; returns notes (one line each).
  """
  chosen = check_fits(config, family)
  os.makedirs(out, exist_ok=True)
  for name in os.listdir(out):  # an earlier export's shards would mix in
    if name.startswith('model') and name.endswith(('.safetensors', '.json')):
      os.remove(os.path.join(out, name))
  with open(os.path.join(out, HF_CONFIG), 'w') as f:
    json.dump(hf_config(config, tokenizer, chosen.name), f, indent=2,
              sort_keys=True)
  write_weights(config, params, out, chosen, max_shard_bytes)
  converted = hf_tokenizer.to_huggingface(tokenizer)
  if converted is None:
    return [f'The {tokenizer.kind} tokenizer has no transformers form here, '
            f'so {out} holds the model only (the workdir\'s tokenizer/ has '
            'it for the sentencepiece library).']
  hf_tokenizer.save_pretrained(converted, out)
  return []
