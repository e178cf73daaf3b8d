"""jax_transformer: the Transformer of "Attention Is All You Need" in JAX
and Flax NNX.

The names below load their modules on first use, so that importing a light
module of the package (``jax_transformer.cli``, ``jax_transformer.errors``)
does not import JAX and Flax: train.py answers a bad flag or ``--help`` at
once.
"""

from jax_transformer import started  # first: its import is the start  # noqa: F401, I001

import importlib
import importlib.abc
import sys


class _NotInIPython(importlib.abc.MetaPathFinder):
  """flax.nnx asks, while it is imported, whether it runs inside IPython
  (for colours), by importing IPython where it is installed: about 0.5 s
  of every start of every process. Inside IPython, IPython is already
  loaded and this finder is never asked; otherwise the answer is no, so
  while flax.nnx is being imported, an IPython not yet loaded is reported
  missing instead of imported. Any other import of IPython is untouched."""

  def find_spec(self, name, path=None, target=None):
    del path, target
    nnx = sys.modules.get('flax.nnx')
    if name == 'IPython' and getattr(getattr(nnx, '__spec__', None),
                                     '_initializing', False):
      raise ModuleNotFoundError('IPython is not running', name=name)
    return None


if not any(isinstance(f, _NotInIPython) for f in sys.meta_path):
  sys.meta_path.insert(0, _NotInIPython())

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
