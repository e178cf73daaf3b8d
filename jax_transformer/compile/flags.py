"""The command-line flags of compiling for a target, defined once.

``scripts/compile_at_size.py`` and ``scripts/plan.py`` take ``--target``
and ``--slices``, ``train.py`` the same as ``--aot_target`` and
``--aot_slices``; those two, ``scripts/target_table.py`` and
``compile_at_size.py`` write their JSON rows to ``--output``. Each calls
the ``define_*`` functions here on its absl ``FlagValues`` and reads its
command line with ``parse``. Nothing here imports JAX, so ``train.py
--help`` stays fast.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import flags

from jax_transformer import cli
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment, doors

# The names are parsed by jax_transformer/runtime/targets.py, which imports
# JAX; a name that is not a slice is refused there, in one sentence.
TARGETS_HELP = ('an accelerator target: a TPU slice v4-N, v5p-N (N '
                'TensorCores), v5e-N, v6e-N (N chips), e.g. v5e-4, v5p-64, '
                'v6e-256, or GPU hosts h100-N, h200-N (8 GPUs a host), e.g. '
                'h100-16')


def define_target(values: flags.FlagValues, prefix: str = '',
                  help_: str | None = None) -> None:
  """``--{prefix}target NAME`` and ``--{prefix}slices N`` (TPU slices)."""
  flags.DEFINE_string(f'{prefix}target', None,
                      help_ or f'Compile for {TARGETS_HELP}.',
                      flag_values=values)
  flags.DEFINE_integer(f'{prefix}slices', 1,
                       f'With --{prefix}target: TPU slices (the devices '
                       'come slice by slice; the data axis spans them).',
                       flag_values=values)


def define_overlap(values: flags.FlagValues) -> None:
  """``--[no]xla_overlap``: the compilers' collective-overlap options
  (``runtime/xla_options.py``), on by default."""
  flags.DEFINE_bool('xla_overlap', True, 'Ask the TPU and GPU compilers to '
                    'overlap collectives with compute (latency-hiding '
                    'scheduler, asynchronous collectives: '
                    'jax_transformer/runtime/xla_options.py); '
                    '--noxla_overlap leaves their defaults.',
                    flag_values=values)


def define_network(values: flags.FlagValues) -> None:
  """``--network_gbps``: the network's rate a chip between hosts (GPUs) or
  slices (TPUs), which the step model prices crossing collectives at."""
  flags.DEFINE_float('network_gbps', None, "Gb/s a chip of the network "
                     'between hosts (GPU targets) or slices (TPU, DCN), for '
                     'the step model; default: the chip\'s '
                     '(jax_transformer/runtime/targets.py: 400 for H100 '
                     'and H200, 50 for v5p, 25 for v4, v5e and v6e).',
                     flag_values=values)


def define_output(values: flags.FlagValues,
                  what: str = 'the JSON rows') -> None:
  """``--output FILE``: where a script also writes its JSON rows."""
  flags.DEFINE_string('output', None, f'Also write {what} here.',
                      flag_values=values)


def define_serialize(values: flags.FlagValues) -> None:
  """``--serialize PATH``: the compiled train step, written."""
  flags.DEFINE_string('serialize', None, 'Write the compiled train step here '
                      '(jax.experimental.serialize_executable).',
                      flag_values=values)


def parse(prog: str, argv: Sequence[str], values: flags.FlagValues,
          doc: str = '', config: str = 'required'
          ) -> tuple[Experiment | None, str | None]:
  """Reads argv (the flags, without the program) into values; returns
  (the experiment, its spec) of ``--config NAME[:preset]`` and its
  ``--config.a.b=value`` overrides: ``config`` is 'required', 'optional'
  ((None, None) where argv names none) or 'never' (no --config flag).

  ``--help`` prints doc and the flags and exits 0; anything wrong on the
  command line is a UsageError.
  """
  argv = list(argv)
  if {'--help', '-h', '--helpfull'} & set(argv):
    takes = ('' if config == 'never' else
             '  --config: NAME[:preset] (a file of configs/) or PATH.py'
             f'[:preset]{" (required)" if config == "required" else ""}; '
             'override any field with --config.a.b=value\n')
    print(f'{doc.strip()}\n\nflags:\n{takes}{values.get_help()}')
    sys.exit(0)
  spec, _ = cli.split_config_spec(argv)
  given = spec is not None or any(
      a.lstrip('-').startswith(('config.', 'noconfig.')) for a in argv)
  if config == 'never' or (config == 'optional' and not given):
    try:
      rest = values([prog, *argv])[1:]
    except flags.UnrecognizedFlagError as e:
      raise UsageError(f'Unknown flag --{e.flagname}; see --help.') from None
    except flags.Error as e:
      raise UsageError(f'{cli.one_line(e)}; see --help.') from None
    cfg = None
  else:
    config, spec, rest = cli.parse_config_flags([prog, *argv], None, values)
    cfg = doors.from_command_line(config)
  if rest:
    raise UsageError(f'Unexpected arguments {rest}.')
  return cfg, spec
