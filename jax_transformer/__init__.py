"""jax_transformer: the Transformer of "Attention Is All You Need" in JAX
and Flax NNX.

The names below load their modules on first use, so that importing a light
module of the package (``jax_transformer.cli``, ``jax_transformer.errors``)
does not import JAX and Flax: train.py answers a bad flag or ``--help`` at
once.
"""

import importlib

_HOMES = {
    'KVCache': 'model.attention',
    'PRESETS': 'model.config', 'ModelConfig': 'model.config',
    'gpt2_small': 'model.config', 'transformer_base': 'model.config',
    'transformer_big': 'model.config',
    'DecoderLM': 'model.models', 'EncoderDecoder': 'model.models',
    'count_params': 'model.models',
    'BeamResult': 'decoding', 'Generation': 'decoding',
    'beam_search': 'decoding', 'generate': 'decoding',
    'Sampler': 'decoding.sampling', 'greedy': 'decoding.sampling',
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
  if name not in _HOMES:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(f'{__name__}.{_HOMES[name]}'), name)
  globals()[name] = value  # later lookups skip this function
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_HOMES))
