"""Frozen config dataclasses to and from plain values.

An experiment is a tree of frozen dataclasses (``jax_transformer/experiment``).
The command line edits it as an ``ml_collections.ConfigDict`` (so every
``--config.a.b=value`` keeps its path and type) and a workdir keeps it as
JSON; these functions cross between the forms:

- :func:`build` makes a dataclass from a mapping (a ConfigDict, a dict read
  from ``config.json``): fields it lacks take their defaults (a workdir
  saved before a field existed still loads), a name that is no field is
  refused in one sentence with the closest name, and JSON's lists become
  the tuples the fields hold.
- :func:`to_dict` is its inverse, and :func:`to_config_dict` gives the
  ConfigDict the command line overrides, with a typed placeholder for each
  field that is None by default.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from typing import Any, Mapping

from ml_collections import ConfigDict, config_dict

from jax_transformer.errors import UsageError


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _kinds(hint: Any) -> tuple[Any, ...]:
  """The types a hint allows, None excluded (``int | None`` -> (int,))."""
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    return tuple(k for k in typing.get_args(hint) if k is not type(None))
  return (hint,)


def _base(kind: Any) -> Any:
  """tuple[...] -> tuple, Literal['a'] -> str, a class -> itself."""
  origin = typing.get_origin(kind)
  if origin is typing.Literal:
    return type(typing.get_args(kind)[0])
  return origin or kind


def _value(hint: Any, value: Any, where: str) -> Any:
  """value as a field of this hint holds it: a nested dataclass built, a
  list made a tuple, an int made a float where the field is a float."""
  if value is None:
    return None
  for kind in map(_base, _kinds(hint)):
    if dataclasses.is_dataclass(kind):
      return build(kind, value, where)
    if kind is tuple and isinstance(value, list):
      return tuple(_plain(v) for v in value)
    if kind is float and isinstance(value, int) and not isinstance(
        value, bool):
      return float(value)
  return _plain(value)


def _plain(value: Any) -> Any:
  """A ConfigDict (or one nested in a list) as the dicts JSON would give."""
  if isinstance(value, ConfigDict):
    return value.to_dict()
  if isinstance(value, (list, tuple)):
    return type(value)(_plain(v) for v in value)
  return value


def build(cls: type, values: Any, where: str = 'config') -> Any:
  """A ``cls`` from a mapping of its fields (or ``values`` if already one).

  where: the path the refusals name (``config.optim``).
  Raises UsageError for a key that is no field of cls, or a value that is
  not a group of fields where cls expects one.
  """
  if isinstance(values, cls):
    return values
  if not isinstance(values, (Mapping, ConfigDict)):
    raise UsageError(f'{where} must be a group of fields, got {values!r}.')
  names = [f.name for f in dataclasses.fields(cls) if f.init]
  hints = _hints(cls)
  given = dict(values.items())
  for key in given:
    if key not in names:
      near = difflib.get_close_matches(key, names, n=1)
      hint = (f'did you mean {where}.{near[0]}?' if near else
              f'its fields are {", ".join(sorted(names))}.')
      raise UsageError(f'{where} has no field {key!r}; {hint}')
  return cls(**{k: _value(hints[k], v, f'{where}.{k}')
                for k, v in given.items()})


def to_dict(obj: Any) -> dict[str, Any]:
  """A config dataclass as nested dicts of plain values (JSON-ready but for
  tuples, which JSON writes as lists)."""
  return {f.name: (to_dict(v) if dataclasses.is_dataclass(v) else v)
          for f in dataclasses.fields(obj)
          for v in [getattr(obj, f.name)]}


def to_config_dict(obj: Any) -> ConfigDict:
  """A config dataclass as the ConfigDict the command line overrides: each
  field unset by default is a placeholder of its type, so
  ``--config.data.data_dir=DIR`` parses as the field's type."""
  out = ConfigDict()
  hints = _hints(type(obj))
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    if dataclasses.is_dataclass(value):
      out[f.name] = to_config_dict(value)
    elif value is None:
      out[f.name] = config_dict.placeholder(_base(_kinds(hints[f.name])[0]))
    else:
      out[f.name] = value
  return out


def replace_in(obj: Any, path: str, value: Any) -> Any:
  """obj with the field at a dotted path (``'optim.grad_accum_steps'``)
  replaced, the dataclasses above it copied."""
  head, _, rest = path.partition('.')
  if rest:
    value = replace_in(getattr(obj, head), rest, value)
  return dataclasses.replace(obj, **{head: value})


def not_an_integer(name: str, value: Any, least: int = 1,
                   meaning: str = '') -> UsageError:
  """The one sentence refusing ``value`` for a field that takes an integer
  >= least (meaning: what a value says, e.g. ' (0: off)')."""
  return UsageError(f'{name} must be an integer >= {least}{meaning}, got '
                    f'{value!r}.')


def check_integer(name: str, value: Any, least: int = 1,
                  meaning: str = '') -> int:
  """value where it is an integer >= least (a bool is not); else
  :func:`not_an_integer`'s sentence. name: as the user writes it
  (``config.num_steps``, ``--batch_size``)."""
  if isinstance(value, bool) or not hasattr(value, '__index__') or (
      value < least):
    raise not_an_integer(name, value, least, meaning)
  return int(value)
