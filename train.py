"""Train a Transformer: python train.py --config configs/NAME.py[:preset] --workdir DIR.

With no flags it runs the default job (configs/lm_shakespeare.py): a small
decoder-only LM on the offline Shakespeare corpus. Override any config field
with --config.a.b=value. Restarting with the same --workdir resumes.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               'configs', 'lm_shakespeare.py')
config_flags.DEFINE_config_file('config', _DEFAULT_CONFIG,
                                'Experiment config file[:preset].')
flags.DEFINE_string('workdir', None, 'Checkpoints, metrics, config and '
                    'tokenizer go here (default: runs/<config name>).')
flags.DEFINE_string('coordinator_address', None,
                    'host:port of process 0, for multi-host runs without '
                    'automatic cluster detection.')
flags.DEFINE_integer('num_processes', None, 'Processes in a multi-host run.')
flags.DEFINE_integer('process_id', None, 'This process, 0..num_processes-1.')
# Multi-process bounds, in seconds (see jax_transformer/distributed.py).
flags.DEFINE_float('init_timeout', 300, 'How long every process may take to '
                   'join a multi-process run.')
flags.DEFINE_float('heartbeat_timeout', 60, 'A process silent this long is '
                   'lost: the others stop with exit status 69, naming it and '
                   'the newest checkpoint.')
flags.DEFINE_float('barrier_timeout', 300, 'How long a barrier, and the exit, '
                   'waits for the other processes.')
flags.DEFINE_float('data_timeout', 6 * 3600, 'How long the other processes '
                   'wait while process 0 prepares the dataset.')
flags.DEFINE_string('compilation_cache_dir',
                    os.path.join('~', '.cache', 'jax_transformer', 'xla'),
                    'Persistent XLA compilation cache: a second start with '
                    'the same shapes skips compiling ("" turns it off).')
flags.DEFINE_bool('retain_host_memory', True, 'Keep freed host memory for '
                  'reuse (glibc), so CPU steps do not page-fault their '
                  'temporaries in every step (see jax_transformer/'
                  'host_memory.py).')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if FLAGS.retain_host_memory:
    from jax_transformer import host_memory  # pylint: disable=g-import-not-at-top
    host_memory.retain_freed_memory()
  if not FLAGS['verbosity'].present:
    # Orbax logs every file it writes at INFO.
    logging.set_verbosity(logging.WARNING)
  # Imported after flag parsing so --help stays fast.
  import jax  # pylint: disable=g-import-not-at-top
  from jax_transformer import distributed, trainer  # pylint: disable=g-import-not-at-top
  if FLAGS.compilation_cache_dir:
    jax.config.update('jax_compilation_cache_dir',
                      os.path.expanduser(FLAGS.compilation_cache_dir))
  distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                         FLAGS.process_id, distributed.Timeouts(
                             init=FLAGS.init_timeout,
                             heartbeat=FLAGS.heartbeat_timeout,
                             barrier=FLAGS.barrier_timeout,
                             data=FLAGS.data_timeout))
  cfg = FLAGS.config
  workdir = FLAGS.workdir or os.path.join(
      'runs', os.path.splitext(os.path.basename(
          config_flags.get_config_filename(FLAGS['config'])))[0])
  result = trainer.train_and_evaluate(cfg, workdir)
  if result.get('interrupted'):
    # Saved and stopped early: not finished (see trainer.EXIT_INTERRUPTED).
    sys.exit(trainer.EXIT_INTERRUPTED)


if __name__ == '__main__':
  app.run(main)
