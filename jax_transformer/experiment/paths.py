"""The paths an experiment names, made absolute: what a workdir's
config.json stores, so that the workdir is read the same from any
directory (evaluate, generate and export from elsewhere; a LoRA run's
frozen base, read again from ``init_from``).

A local path or glob is made absolute against the current directory (with
``~`` expanded); a URL (``gs://...``) stays as it is, and so does an
``init_from`` that is no local path (a model id in the Hugging Face cache,
``org/name``). A config.json written before paths were stored absolute
reads the same way: its relative paths are taken from the current
directory, as they always were.

Which fields are paths, and how each is made absolute, is said by the
kinds of source that own them (``data_options``), not listed here.
"""

from __future__ import annotations

import os
from typing import Any

from jax_transformer.experiment import data_options
from jax_transformer.experiment.data import DataConfig


def absolute(path: Any, existing_only: bool = False) -> Any:
  """path made absolute where it is a local path (given existing_only,
  one that exists); anything else as it is."""
  if not isinstance(path, str) or not path or '://' in path:
    return path
  local = os.path.expanduser(path)
  if existing_only and not os.path.exists(local):
    return path
  return os.path.abspath(local)


def absolute_globs(patterns: Any) -> Any:
  """Comma-separated globs, each local one made absolute."""
  if not isinstance(patterns, str) or not patterns:
    return patterns
  return ','.join(absolute(p.strip()) for p in patterns.split(',')
                  if p.strip())


def _fields(values: dict[str, Any]) -> dict[str, Any]:
  """values with each path field that is set made absolute, as its kind
  says (``data_options.path_fields``)."""
  out = dict(values)
  for name, how in data_options.path_fields().items():
    if not out.get(name):
      continue
    if how == data_options.GLOBS:
      out[name] = absolute_globs(out[name])
    else:
      out[name] = absolute(out[name],
                           existing_only=how == data_options.EXISTING)
  return out


def absolute_data(d: DataConfig) -> DataConfig:
  """A data config with its paths, and its mixture sources', absolute."""
  changes = _fields({k: getattr(d, k)
                     for k in data_options.path_fields()})
  if d.mixture and not isinstance(d.mixture, (str, dict)):
    changes['mixture'] = tuple(
        _fields(dict(entry.to_dict() if hasattr(entry, 'to_dict') else entry))
        if hasattr(entry, 'keys') else entry for entry in d.mixture)
  return d.replace(**changes)


def absolute_paths(exp):
  """An Experiment with init_from (where it is a local path) and its data's
  paths absolute."""
  return exp.replace(init_from=absolute(exp.init_from, existing_only=True),
                     data=absolute_data(exp.data))
