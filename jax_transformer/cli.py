"""What the command-line entry points share: bad input is one line on
stderr and exit status 2, and experiment configs are read one way.

``train.py`` and every script in ``scripts/`` wrap their ``main`` in
:func:`entry_point`: a :class:`~jax_transformer.errors.UsageError` raised
anywhere below it (the scripts' own checks, the library's config and input
checks) prints ``PROG: error: SENTENCE`` and returns :data:`EXIT_USAGE`.
Any other exception keeps its traceback: it is a bug, or a failure of the
machine, that one sentence would hide.

:func:`parse_config_flags` reads ``--config NAME[:preset]`` (a file of the
``configs/`` beside train.py) or ``--config PATH.py[:preset]``, and
``--config.a.b=value`` overrides with ``ml_collections.config_flags``, after
checking what it would otherwise report as a traceback: a missing file, an
unknown preset, a misspelt field, a value of the wrong type.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import gc
import importlib.util
import inspect
import os
import re
import sys
from typing import Any, Callable, Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

from jax_transformer import fields
from jax_transformer.errors import UsageError

# Bad input, as argparse and absl report it.
EXIT_USAGE = 2


def one_line(message: Any) -> str:
  """The message with its line breaks and runs of spaces made single
  spaces, so that a report is always one line."""
  return ' '.join(str(message).split())


def report(prog: str, error: UsageError) -> int:
  """Prints the error as one line on stderr; returns EXIT_USAGE."""
  print(f'{prog}: error: {one_line(error)}', file=sys.stderr)
  return EXIT_USAGE


def entry_point(prog: str) -> Callable[[Callable[..., int]],
                                       Callable[..., int]]:
  """Decorates ``main(...) -> exit status``: a UsageError becomes one line
  on stderr and EXIT_USAGE; other exceptions pass through."""

  def decorate(main: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(main)
    def run(*args, **kwargs) -> int:
      try:
        return main(*args, **kwargs)
      except UsageError as e:
        return report(prog, e)
    return run

  return decorate


def then_exit(main: Callable[..., int]) -> Callable[..., int]:
  """``main`` for a process that ends when it returns (``if __name__ ==
  '__main__'`` only, never in-process): afterwards every object alive is
  frozen (``gc.freeze``), so that the interpreter's shutdown does not walk
  them in its garbage collections. A process that imported JAX, Flax and
  TFDS spends 0.6-1.4 s of its exit there, 0.1 s frozen. Objects are still
  freed by reference counting and atexit handlers still run."""

  @functools.wraps(main)
  def run(*args, **kwargs) -> int:
    try:
      return main(*args, **kwargs)
    finally:
      gc.freeze()

  return run


class ArgumentParser(argparse.ArgumentParser):
  """argparse with its errors on one line (no usage block), still exit
  status 2, and no abbreviated flags (a typo should not pick a flag)."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault('allow_abbrev', False)
    super().__init__(*args, **kwargs)

  def error(self, message: str):
    sys.exit(report(self.prog, UsageError(f'{message}; see --help.')))


# ----------------------------------------------------------------------------
# Experiment configs: NAME[:preset] or PATH.py[:preset], and --config.a.b=value.

_CONFIG_FLAG = re.compile(r'^--?config(=|$)')
_OVERRIDE = re.compile(r'^--?(?:no)?config\.([^=]+)')


def split_config_spec(argv: Sequence[str]
                      ) -> tuple[str | None, list[str]]:
  """(the value of --config in argv or None, argv without it)."""
  spec, rest = None, []
  args = iter(argv)
  for arg in args:
    match = _CONFIG_FLAG.match(arg)
    if not match:
      rest.append(arg)
    elif match.group(1) == '=':
      spec = arg.split('=', 1)[1]
    else:
      spec = next(args, '')
  return spec, rest


# Where `--config NAME` looks: the configs/ folder beside train.py (and this
# package), whatever the working directory.
CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'configs')


def config_names() -> list[str]:
  """The names ``--config NAME`` accepts: the files of CONFIGS_DIR."""
  if not os.path.isdir(CONFIGS_DIR):
    return []
  return sorted(name[:-3] for name in os.listdir(CONFIGS_DIR)
                if name.endswith('.py') and not name.startswith('_'))


def names_a_file(name_or_path: str) -> bool:
  """Whether a --config value (less its :preset) is a path, not a name."""
  return ('/' in name_or_path or os.sep in name_or_path
          or name_or_path.endswith('.py'))


def config_path(name_or_path: str) -> str:
  """The file of ``--config NAME`` (a file of configs/) or of a path.

  A value with a '/' or ending in '.py' is a path (relative to the working
  directory); anything else is a name. Raises UsageError when neither
  names a file.
  """
  if names_a_file(name_or_path):
    if not os.path.isfile(name_or_path):
      raise UsageError(f'--config {name_or_path}: the file does not exist; '
                       'give a config name such as lm_shakespeare or a file '
                       'such as configs/lm_shakespeare.py.')
    return name_or_path
  path = os.path.join(CONFIGS_DIR, f'{name_or_path}.py')
  if not os.path.isfile(path):
    near = difflib.get_close_matches(name_or_path, config_names(), n=1)
    hint = (f'did you mean {near[0]}?' if near else
            f'the names are {", ".join(config_names()) or "(none)"}.')
    raise UsageError(f'--config {name_or_path}: there is no config of that '
                     f'name in {CONFIGS_DIR}; {hint}')
  return path


def load_config(spec: str) -> ml_collections.ConfigDict:
  """``get_config(preset)`` of ``NAME[:preset]`` or ``PATH.py[:preset]``.

  NAME is a file of the configs/ folder beside train.py; a config file
  imports only from ``jax_transformer``, so nothing is put on sys.path.
  Raises UsageError when the file is missing, has no get_config, or does
  not take (or rejects) the preset.
  """
  name, _, preset = spec.partition(':')
  if not name:
    raise UsageError('--config is empty; give a config such as '
                     'lm_shakespeare[:preset] or configs/lm_shakespeare.py.')
  path = config_path(name)
  module_spec = importlib.util.spec_from_file_location(
      f'config_{os.path.splitext(os.path.basename(path))[0]}', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  get_config = getattr(module, 'get_config', None)
  if not callable(get_config):
    raise UsageError(f'--config {spec}: {path} has no get_config() '
                     'function; give an experiment config file.')
  args = (preset,) if preset else ()
  try:
    inspect.signature(get_config).bind(*args)
  except TypeError:
    raise UsageError(f'--config {spec}: {path} takes '
                     f'{"no preset" if preset else "a preset"}; '
                     f'write it as {path}{"" if preset else ":NAME"}.'
                     ) from None
  try:
    cfg = get_config(*args)
  except ValueError as e:  # the config's own refusal, e.g. an unknown preset
    raise UsageError(f'--config {spec}: {one_line(e)}') from None
  if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
    # An Experiment: the command line overrides its ConfigDict form.
    return fields.to_config_dict(cfg)
  if not isinstance(cfg, ml_collections.ConfigDict):
    raise UsageError(f'--config {spec}: get_config() returned a '
                     f'{type(cfg).__name__}, not an Experiment or an '
                     'ml_collections ConfigDict.')
  return cfg


def check_overrides(cfg: ml_collections.ConfigDict, spec: str,
                    argv: Sequence[str]) -> None:
  """Raises UsageError naming the first --config.a.b in argv that is not a
  field of cfg, with the nearest field names as suggestions."""
  for arg in argv:
    match = _OVERRIDE.match(arg)
    if match:
      _check_field(cfg, spec, match.group(1))


def _check_field(cfg: ml_collections.ConfigDict, spec: str,
                 path: str) -> None:
  node, done = cfg, []
  for part in path.split('.'):
    if not isinstance(node, ml_collections.ConfigDict):
      raise UsageError(f'--config.{path}: config.{".".join(done)} is '
                       f'{node!r}, not a group of fields.')
    if part not in node:
      where = 'config.' + '.'.join(done) if done else 'the config'
      near = difflib.get_close_matches(part, list(node.keys()), n=1)
      hint = (f'did you mean --config.{".".join(done + near)}?' if near
              else f'its fields are {", ".join(sorted(node.keys()))}.')
      raise UsageError(f'--config.{path}: {where} of {spec} has no field '
                       f'{part!r}; {hint}')
    node, done = node[part], done + [part]


def parse_config_flags(argv: Sequence[str], default: str | None = None,
                       flag_values=None
                       ) -> tuple[ml_collections.ConfigDict, str, list[str]]:
  """(config, its spec, the arguments no flag took) from a command line.

  argv: the program name, then flags: ``--config NAME[:preset]``
    (else ``default``), ``--config.a.b=value`` overrides, and any flag
    defined on ``flag_values``.
  flag_values: the absl FlagValues to parse into (default: a fresh one).
    The config becomes its ``config`` flag; each override becomes a flag
    typed as its field, as ``config_flags.DEFINE_config_file`` makes them.

  Raises UsageError, before the config is used, for anything on the
  command line that is wrong.
  """
  values = flags.FlagValues() if flag_values is None else flag_values
  try:  # --flagfile=FILE: its flags are read as if on the command line
    argv = values.read_flags_from_files(list(argv), force_gnu=False)
  except flags.Error as e:
    raise UsageError(f'{_flag_text(e).rstrip(".")}.') from None
  spec, argv = split_config_spec(argv)
  spec = default if spec is None else spec
  if spec is None:
    raise UsageError('--config is required; give a config such as '
                     'lm_shakespeare[:preset] or configs/lm_shakespeare.py.')
  cfg = load_config(spec)
  check_overrides(cfg, spec, argv)
  try:
    config_flags.DEFINE_config_dict('config', cfg, 'The experiment config.',
                                    flag_values=values, sys_argv=list(argv))
    rest = values(list(argv))
  except flags.IllegalFlagValueError as e:
    raise UsageError(f'{_flag_text(e)}; give a value of the flag\'s type.'
                     ) from None
  except flags.UnrecognizedFlagError as e:
    near = difflib.get_close_matches(e.flagname, list(values), n=1)
    hint = f'did you mean --{near[0]}?' if near else 'see --help.'
    raise UsageError(f'Unknown flag --{e.flagname}; {hint}') from None
  except flags.Error as e:  # e.g. a config field of an unsupported type
    raise UsageError(f'{_flag_text(e).rstrip(".")}; see --help.') from None
  return values['config'].value, spec, rest[1:]


def _flag_text(error: Exception) -> str:
  """absl's message, on one line, without its leading 'flag ' or
  'ERROR:: '."""
  return one_line(error).removeprefix('flag ').removeprefix('ERROR:: ')
