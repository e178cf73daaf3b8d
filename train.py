"""Train a Transformer: python train.py --config NAME[:preset] --workdir DIR.

With no flags it runs the default job (configs/lm_shakespeare.py): a small
decoder-only LM on the offline Shakespeare corpus. Override any config field
with --config.a.b=value. Restarting with the same --workdir resumes.

Exit status: 0 finished; 1 stopped by a non-finite loss or gradient norm
or a failed checkpoint write (naming the step and the last checkpoint); 2 a
bad flag or a config that cannot run (one line on stderr, before any data
is prepared or anything compiles, or a run --aot_target says does not
fit); 69 another process of a multi-process run was lost; 75 stopped by
SIGTERM or SIGINT after saving a checkpoint (or before the first step,
with nothing new to save); 124 stuck (no step finished within
config.step_timeout_s).

--aot_target NAME (e.g. v5p-128, h100-8) compiles the run as configured
with that accelerator's compiler on this host, without the hardware, and
exits 0 if it fits (2 if not), before any data preparation.
"""

import os
import sys
from typing import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from jax_transformer import cli
from jax_transformer.compile import flags as target_flags
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment, doors
from jax_transformer.runtime import compile_cache, exits

PROG = 'train.py'
DEFAULT_CONFIG = 'lm_shakespeare'  # configs/lm_shakespeare.py
FLAGS = flags.FLAGS
CONFIG_SPEC = [DEFAULT_CONFIG]  # --config as given, set by parse_flags


def define_flags(values: flags.FlagValues) -> None:
  """Every flag but --config, which parse_flags defines from the command
  line (its --config.a.b overrides become flags of their fields' types)."""
  flags.DEFINE_string('workdir', None, 'Checkpoints, metrics, config and '
                      'tokenizer go here (default: runs/<config name>).',
                      flag_values=values)
  flags.DEFINE_string('coordinator_address', None,
                      'host:port of process 0, for multi-host runs that JAX '
                      'does not detect (TPU VMs, SLURM, Open MPI, GKE, '
                      'Kubernetes are detected).', flag_values=values)
  flags.DEFINE_integer('num_processes', None,
                       'Processes in a multi-host run.', flag_values=values)
  flags.DEFINE_integer('process_id', None,
                       'This process, 0..num_processes-1.',
                       flag_values=values)
  # Multi-process bounds, in seconds (see runtime/distributed.py).
  flags.DEFINE_float('init_timeout', 300, 'How long every process may take '
                     'to join a multi-process run.', flag_values=values)
  flags.DEFINE_float('heartbeat_timeout', 60, 'A process silent this long is '
                     'lost: the others stop with exit status 69, naming it '
                     'and the newest checkpoint.', flag_values=values)
  flags.DEFINE_float('barrier_timeout', 300, 'How long a barrier, and the '
                     'exit, waits for the other processes.',
                     flag_values=values)
  flags.DEFINE_float('data_timeout', 6 * 3600, 'How long the other processes '
                     'wait while process 0 prepares the dataset.',
                     flag_values=values)
  flags.DEFINE_string('compilation_cache_dir', compile_cache.DEFAULT_DIR,
                      compile_cache.HELP, flag_values=values)
  target_flags.define_target(
      values, prefix='aot_', help_='Only compile the run for this '
      'accelerator target (e.g. v5p-128, h100-8) with its own compiler, '
      'here, without the hardware: exit 0 if it fits, 2 if not (needs pip '
      "install -e '.[aot]').")
  target_flags.define_overlap(values)
  # Listed by --help as train.py's own flags.
  flags.adopt_module_key_flags(target_flags, flag_values=values)
  flags.DEFINE_bool('retain_host_memory', True, 'Keep freed host memory for '
                    'reuse (glibc), so CPU steps do not page-fault their '
                    'temporaries in every step (see jax_transformer/'
                    'runtime/host_memory.py).', flag_values=values)


define_flags(FLAGS)


def parse_flags(argv: Sequence[str],
                values: flags.FlagValues = FLAGS) -> list[str]:
  """Parses argv into values (--config: NAME[:preset] or PATH.py[:preset],
  default lm_shakespeare) and fills in the default --workdir (runs/NAME).

  Raises UsageError for anything wrong on the command line: an unknown
  flag or config field, a missing config file or preset, a value of the
  wrong type, a stray argument.
  """
  _, spec, rest = cli.parse_config_flags(argv, DEFAULT_CONFIG, values)
  CONFIG_SPEC[0] = spec
  if rest:
    raise UsageError(f'Unexpected arguments {rest}; flags look like '
                     '--workdir=DIR or --config.a.b=value.')
  if values.workdir is None:
    name = os.path.splitext(os.path.basename(spec.partition(':')[0]))[0]
    values.workdir = os.path.join('runs', name)
  return list(argv[:1])


def _flags_parser(argv: Sequence[str]) -> list[str]:
  """absl's flags_parser: bad flags are one line and exit status 2."""
  try:
    return parse_flags(argv)
  except UsageError as e:
    sys.exit(cli.report(PROG, e))


def compile_for_target(values: flags.FlagValues) -> int:
  """--aot_target: the run's steps compiled for the target, nothing else,
  started as compile_at_size.py --target starts (``targets.start``).
  """
  from jax_transformer.runtime import targets  # pylint: disable=g-import-not-at-top
  with targets.start(values.aot_target, overlap=values.xla_overlap):
    from jax_transformer.compile import report  # pylint: disable=g-import-not-at-top
  row = report.check_fits(doors.from_command_line(values.config),
                          CONFIG_SPEC[0], values.aot_target, values.aot_slices)
  print(report.summary(row))
  return 0


def command_line_fields(values: flags.FlagValues) -> set[str]:
  """The config fields the command line gave (``model.d_model``, ...)."""
  try:
    return set(config_flags.get_override_values(values['config']))
  except Exception:  # pylint: disable=broad-except
    return set()


def apply_recipe_rules(values: flags.FlagValues, given: set[str]) -> None:
  """The rules a recipe keeps for the fields the command line changed,
  applied once, here: config.sample.prompt emptied (the sample then
  starts from a validation document: ``evaluating.data_prompt``) where
  --config.data.name names other data than the recipe's and
  --config.sample.prompt is not given: the recipe's prompt (Shakespeare's
  'ROMEO:') is its data's."""
  from jax_transformer.train import recipes  # pylint: disable=g-import-not-at-top
  recipes.prompt_for_own_data(values.config, given,
                              lambda: cli.load_config(CONFIG_SPEC[0]))


def harness_hooks(config: Experiment) -> list:
  """The hook scoring config.eval_harness's lm-eval tasks, if it names
  any; their data is loaded now, before the run's."""
  if not str(config.eval_harness.tasks).strip():
    return []
  try:
    from jax_transformer.harness import during_training  # pylint: disable=g-import-not-at-top
  except ModuleNotFoundError as e:
    raise UsageError(f'config.eval_harness needs lm-eval ({e}); install it '
                     "with pip install -e '.[eval]'.") from None
  return during_training.hooks_for(config)


@cli.entry_point(PROG)
def main(argv: Sequence[str], values: flags.FlagValues = FLAGS) -> int:
  """Trains values.config into values.workdir; returns the exit status."""
  del argv  # parse_flags refused any argument that is not a flag
  # Before JAX starts a backend (or a target's compiler): the compilers
  # read their options once.
  from jax_transformer.runtime import xla_options  # pylint: disable=g-import-not-at-top
  xla_options.apply(on=values.xla_overlap)
  if values.aot_target:
    return compile_for_target(values)
  if values.retain_host_memory:
    from jax_transformer.runtime import host_memory  # pylint: disable=g-import-not-at-top
    host_memory.retain_freed_memory()
  if 'verbosity' in values and not values['verbosity'].present:
    # Orbax logs every file it writes at INFO.
    logging.set_verbosity(logging.WARNING)
  # Before JAX or any data: a bucket that cannot be reached is one sentence
  # now, not a minute of the filesystem's retries later.
  from jax_transformer.runtime import storage  # pylint: disable=g-import-not-at-top
  storage.check_reachable(values.workdir)
  # Imported after flag parsing so --help stays fast.
  import jax  # pylint: disable=g-import-not-at-top

  from jax_transformer.runtime import distributed  # pylint: disable=g-import-not-at-top
  from jax_transformer.train import preemption, trainer
  compile_cache.use(jax.config, values.compilation_cache_dir)
  distributed.initialize(values.coordinator_address, values.num_processes,
                         values.process_id, distributed.Timeouts(
                             init=values.init_timeout,
                             heartbeat=values.heartbeat_timeout,
                             barrier=values.barrier_timeout,
                             data=values.data_timeout))
  print(distributed.describe_job(), flush=True)  # one line per process
  given = command_line_fields(values)
  apply_recipe_rules(values, given)
  exp = doors.from_command_line(values.config)
  try:
    result = trainer.train_and_evaluate(exp, values.workdir,
                                        harness_hooks(exp), explicit=given)
  except preemption.StoppedBeforeFirstStep as stopped:
    # Preparing the data or waiting for the first batch: one line.
    print(f'{PROG}: {stopped}', file=sys.stderr, flush=True)
    return exits.EXIT_INTERRUPTED
  if result.get('interrupted'):
    # Saved and stopped early: not finished (see runtime/exits.py).
    return exits.EXIT_INTERRUPTED
  return 0


if __name__ == '__main__':
  app.run(cli.then_exit(main), flags_parser=_flags_parser)
