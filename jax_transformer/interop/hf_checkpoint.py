"""A Hugging Face model folder as a source of weights.

``hf_folder`` finds the folder (a path, or a model id in the Hugging Face
cache, read offline); ``hf_source`` reads its ``config.json`` into the
project's model fields (``hf_families``' tables: GPT-2, Llama 2/3,
Mistral, Qwen2) and its ``tokenizer.json``; ``place_tensors`` streams its
safetensors onto a run's shardings tensor by tensor: each device's block
of each parameter is read from the files (memory-mapped) when it is
placed, so no host or device ever holds the whole model at once.

A run starting from such a folder is ``train/init_from.py``'s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import struct
from typing import Any, Callable, Mapping

import jax
import ml_dtypes
import numpy as np
from tokenizers import Tokenizer

from jax_transformer.data.tokenizers import HuggingFaceTokenizer
from jax_transformer.errors import UsageError
from jax_transformer.experiment import run
from jax_transformer.interop import hf_families
from jax_transformer.model import params as params_lib
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.families import DECODER_LM

HF_CONFIG, HF_WEIGHTS, HF_INDEX = (hf_families.HF_CONFIG,
                                   hf_families.HF_WEIGHTS,
                                   hf_families.HF_INDEX)
# Fields a run takes from its own config, whatever the checkpoint's were.
RUNTIME_FIELDS = (*run.RUNTIME_MODEL_FIELDS, 'param_dtype')


# ----------------------------------------------------------------------------
# Safetensors, tensor by tensor.

_DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
           'I64': np.int64, 'I32': np.int32, 'I16': np.int16, 'I8': np.int8,
           'U8': np.uint8, 'BOOL': np.bool_}


def _dtype(name: str):
  return ml_dtypes.bfloat16 if name == 'BF16' else _DTYPES[name]


class TensorFiles:
  """The tensors of one safetensors file or of a sharded set, read one at a
  time through a memory map (bfloat16 included, which safetensors' numpy
  reader refuses): only the tensor asked for is read."""

  def __init__(self, files: list[str], rename: Callable[[str], str]
               = lambda k: k):
    self._where: dict[str, tuple[str, int, dict[str, Any]]] = {}
    for path in files:
      with open(path, 'rb') as f:
        (size,) = struct.unpack('<Q', f.read(8))
        header = json.loads(f.read(size))
      for key, info in header.items():
        if key != '__metadata__':
          self._where[rename(key)] = (path, 8 + size, info)

  @classmethod
  def of_folder(cls, folder: str) -> TensorFiles:
    """model.safetensors or the shards its index names."""
    single, index = (os.path.join(folder, HF_WEIGHTS),
                     os.path.join(folder, HF_INDEX))
    if os.path.exists(single):
      files = [single]
    elif os.path.exists(index):
      with open(index) as f:
        shards = sorted(set(json.load(f)['weight_map'].values()))
      files = [os.path.join(folder, s) for s in shards]
    else:
      raise UsageError(f'{folder} has neither {HF_WEIGHTS} nor {HF_INDEX}.')
    keys = set()
    for path in files:  # GPT-2's hub files name GPT2Model's keys
      with open(path, 'rb') as f:
        (size,) = struct.unpack('<Q', f.read(8))
        keys |= set(json.loads(f.read(size)))
    if 'wte.weight' in keys:
      return cls(files, lambda k: k if k.startswith('lm_head.')
                 else f'transformer.{k}')
    return cls(files)

  def __contains__(self, key: str) -> bool:
    return key in self._where

  @property
  def shapes(self) -> dict[str, tuple[int, ...]]:
    return {k: tuple(info['shape']) for k, (_, _, info) in
            self._where.items()}

  def get(self, key: str, dtype=np.float32) -> np.ndarray:
    """One tensor, as a fresh array of ``dtype``."""
    path, base, info = self._where[key]
    start, end = info['data_offsets']
    shape = tuple(info['shape'])
    if end == start:
      return np.zeros(shape, dtype)
    raw = np.memmap(path, dtype=np.uint8, mode='r', offset=base + start,
                    shape=(end - start,))
    try:
      return raw.view(_dtype(info['dtype'])).reshape(shape).astype(dtype)
    finally:
      del raw


# ----------------------------------------------------------------------------
# A source of weights.


@dataclasses.dataclass(frozen=True, eq=False)
class Source:
  """A pretrained model: where, its model fields, how to read the rest."""
  path: str
  what: str                       # 'Hugging Face <family>' or 'workdir'
  model_kind: str
  fields: dict[str, Any]          # every architecture field of ModelConfig
  tokenizer: Callable[[], Any]
  # (model config, {name: sharding}) -> params placed on the shardings.
  place: Callable[[ModelConfig, Mapping[str, Any]], dict[str, jax.Array]]


def hf_folder(path: str) -> str | None:
  """The folder of a Hugging Face model: ``path`` itself when it holds a
  config.json with a model_type, else a model id (``org/name``) found in
  the Hugging Face cache (offline); None when it is neither."""
  config = os.path.join(path, HF_CONFIG)
  if os.path.isfile(config):
    try:
      with open(config) as f:
        fields = json.load(f)
    except ValueError:  # not JSON: a damaged workdir's, said where it opens
      return None
    return path if isinstance(fields, dict) and 'model_type' in fields \
        else None
  if os.path.exists(path) or path.count('/') != 1:
    return None
  hub = os.environ.get('HF_HUB_CACHE') or os.path.join(
      os.environ.get('HF_HOME') or os.path.join(
          os.path.expanduser('~'), '.cache', 'huggingface'), 'hub')
  repo = os.path.join(hub, 'models--' + path.replace('/', '--'))
  try:
    with open(os.path.join(repo, 'refs', 'main')) as f:
      snapshot = os.path.join(repo, 'snapshots', f.read().strip())
  except OSError:
    return None
  return snapshot if os.path.isfile(os.path.join(snapshot, HF_CONFIG)) \
      else None


def read_hf_config(folder: str) -> dict[str, Any]:
  with open(os.path.join(folder, HF_CONFIG)) as f:
    return json.load(f)


def complete_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
  """Every architecture field: the given ones, ModelConfig's defaults for
  the rest (a GPT-2 file says nothing of rotary scaling), runtime fields
  left out."""
  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  return {k: v for k, v in {**defaults, **fields}.items()
          if k not in RUNTIME_FIELDS}


def hf_tokenizer(folder: str, hf: Mapping[str, Any]) -> HuggingFaceTokenizer:
  """The folder's tokenizer.json with its special tokens; BOS, EOS and PAD
  that the tokenizer files do not name are taken from config.json's ids."""
  if not os.path.exists(os.path.join(folder, 'tokenizer.json')):
    raise UsageError(f'{folder} has no tokenizer.json; save its tokenizer '
                     'there with tokenizer.save_pretrained(...) first.')
  tokenizer = HuggingFaceTokenizer.from_pretrained(folder)
  specials = dict(tokenizer.special_tokens)
  backend = None
  for name in ('bos', 'eos', 'pad'):
    token_id = hf.get(f'{name}_token_id')
    if isinstance(token_id, list):  # Llama 3 instruct: several EOS ids
      token_id = token_id[0] if token_id else None
    if specials.get(name) is None and isinstance(token_id, int):
      backend = backend or Tokenizer.from_str(tokenizer.tokenizer_json)
      specials[name] = backend.id_to_token(token_id)
  if specials != tokenizer.special_tokens:
    tokenizer = HuggingFaceTokenizer(tokenizer.tokenizer_json, specials,
                                     tokenizer.chat_template)
  return tokenizer


def hf_source(folder: str, path: str | None = None) -> Source:
  """A Hugging Face folder as a Source (fields checked now, tensors read
  when placed)."""
  hf = read_hf_config(folder)
  family, fields = hf_families.fields_of(hf, os.path.join(path or folder,
                                                          HF_CONFIG))

  def place(model_config, shardings):
    files = TensorFiles.of_folder(folder)
    return place_tensors(files, family, model_config, shardings,
                         path or folder)

  return Source(path or folder, f'Hugging Face {family.name}', 'decoder_lm',
                complete_fields(fields),
                lambda: hf_tokenizer(folder, hf), place)


def hugging_face_files(folder: str) -> list[str]:
  """The files of a Hugging Face model folder that ``folder`` holds
  (weights, tokenizer), which a training workdir never does."""
  names = sorted(os.listdir(folder))
  return [n for n in names
          if n in (HF_WEIGHTS, HF_INDEX, 'pytorch_model.bin',
                   'tokenizer.json', 'tokenizer_config.json',
                   'generation_config.json')
          or (n.endswith('.safetensors') and n.startswith('model-'))][:4]


# ----------------------------------------------------------------------------
# Placing tensors.


def place_tensors(files: TensorFiles, family: hf_families.Family,
                  model_config: ModelConfig, shardings: Mapping[str, Any],
                  where: str = '') -> dict[str, jax.Array]:
  """The parameters of ``family``'s tensors in ``files`` on ``shardings``
  ({parameter name: NamedSharding}, either layer layout).

  Every key and shape is checked first (one error naming them all). Then
  each parameter is made with ``jax.make_array_from_callback``: each
  device's block is cut from the converted tensor (a scanned stack: from
  the layers in the block), the last few converted tensors kept, so that
  the host holds about one tensor at a time.
  """
  _, abstract = params_lib.abstract(
      lambda: DECODER_LM.model_class(model_config, None))
  unrolled = params_lib.unrolled(abstract)
  entries = family.entries(model_config)
  try:
    hf_families.check_tensors(files.shapes, entries,
                              {k: v.shape for k, v in unrolled.items()},
                              family.ignored_suffixes)
  except ValueError as e:
    raise UsageError(f'{where}: {e}') from None
  by_key = {e.torch_key: e for e in entries}
  source = {}
  for e in entries:
    if e.torch_key in files:
      for i, path in enumerate(e.jax_paths):
        source.setdefault(path, (e.torch_key, i))

  @functools.lru_cache(maxsize=4)
  def converted(key: str) -> list[np.ndarray]:
    return [np.asarray(a) for a in by_key[key].from_torch(files.get(key))]

  def layer(name: str) -> np.ndarray:
    key, i = source[name]
    return converted(key)[i]

  params = {}
  for name, a in abstract.items():
    parts = params_lib._split_name(name)  # pylint: disable=protected-access
    if parts is not None and parts[1] is None:  # a scanned stack
      head, _, tail = parts

      def block(index, head=head, tail=tail, dtype=a.dtype, n=a.shape[0]):
        return np.stack([layer(f'{head}.{i}.{tail}')[index[1:]]
                         for i in range(n)[index[0]]]).astype(dtype)
    else:
      def block(index, name=name, dtype=a.dtype):
        return layer(name)[index].astype(dtype)
    params[name] = jax.make_array_from_callback(a.shape, shardings[name],
                                                block)
  converted.cache_clear()
  return params
