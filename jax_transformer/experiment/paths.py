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

import dataclasses
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


def _made_absolute(value: Any, how: str) -> Any:
  if how == data_options.GLOBS:
    return absolute_globs(value)
  return absolute(value, existing_only=how == data_options.EXISTING)


def _part(entry: dict[str, Any]) -> dict[str, Any]:
  """A mixture's part (a dict of data fields, nested or of the FORMER flat
  names) with each path it sets made absolute."""
  out = dict(entry)
  for name, how in data_options.path_fields().items():
    group, _, field = name.partition('.')
    if field and isinstance(out.get(group), dict) and out[group].get(field):
      out[group] = {**out[group],
                    field: _made_absolute(out[group][field], how)}
    elif not field and out.get(name):
      out[name] = _made_absolute(out[name], how)
  for former, name in data_options.FORMER.items():
    how = data_options.path_fields().get(name)
    if how and out.get(former):
      out[former] = _made_absolute(out[former], how)
  return out


def absolute_data(d: DataConfig) -> DataConfig:
  """A data config with its paths, and its mixture parts', absolute."""
  changes: dict[str, Any] = {}
  for name, how in data_options.path_fields().items():
    group, _, field = name.partition('.')
    holder = changes.get(group, getattr(d, group)) if field else d
    value = getattr(holder, field or name)
    if not value:
      continue
    if field:
      changes[group] = dataclasses.replace(
          holder, **{field: _made_absolute(value, how)})
    else:
      changes[name] = _made_absolute(value, how)
  if d.mixture and not isinstance(d.mixture, (str, dict)):
    changes['mixture'] = tuple(
        _part(dict(entry.to_dict() if hasattr(entry, 'to_dict') else entry))
        if hasattr(entry, 'keys') else entry for entry in d.mixture)
  return d.replace(**changes)


def absolute_paths(exp):
  """An Experiment with init_from (where it is a local path) and its data's
  paths absolute."""
  return exp.replace(init_from=absolute(exp.init_from, existing_only=True),
                     data=absolute_data(exp.data))
