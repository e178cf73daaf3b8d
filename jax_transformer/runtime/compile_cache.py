"""The persistent XLA compilation cache: a second start with the same
shapes loads its programs instead of compiling them (``train.py`` and
``scripts/evaluate.py``'s ``--compilation_cache_dir``). Nothing here
imports JAX: ``train.py`` defines its flags before it does."""

from __future__ import annotations

import os
from typing import Any

DEFAULT_DIR = os.path.join('~', '.cache', 'jax_transformer', 'xla')
# JAX caches only programs that took a second to compile; below that, a
# restart compiled the evaluation step and the state's initialisation again
# (a tiny LM's restart: 10.4-11.3 s -> 8.0-9.0 s of CPU). Where the variable
# is set, it is the user's choice.
MIN_CACHED_COMPILE_S = 0.1
MIN_COMPILE_TIME_VARIABLE = 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'
HELP = ('Persistent XLA compilation cache: a second start with the same '
        'shapes skips compiling ("" turns it off).')


def use(config: Any, directory: str) -> None:
  """Caches compiled programs in ``directory`` (``~`` expanded) through
  ``config`` (``jax.config``, passed in: importing JAX is the caller's
  choice); "" keeps JAX's setting."""
  if not directory:
    return
  config.update('jax_compilation_cache_dir', os.path.expanduser(directory))
  if MIN_COMPILE_TIME_VARIABLE not in os.environ:
    config.update('jax_persistent_cache_min_compile_time_secs',
                  MIN_CACHED_COMPILE_S)
