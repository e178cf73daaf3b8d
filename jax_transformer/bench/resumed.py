"""A training run resumed after kills, checked against one never stopped:
what ``scripts/soak.py`` (kills of one process) and
``scripts/soak_hosts.py`` (hard kills of one of two) share. Both start
train.py as :func:`train_command` says, and a round passes when
:func:`check_round` finds its final checkpoint (parameters, optimizer
state, step, RNG, data position) and every loss it logged equal, bit for
bit, to the uninterrupted run's; :class:`SoakFailure` says what differs.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np

from jax_transformer import data
from jax_transformer.runtime import workdir as workdir_lib
from jax_transformer.train import checkpoint, model_setup

# The checkout this package sits in: the soak scripts run its train.py.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# Logged values that must repeat exactly (timings need not).
EXACT_METRICS = ('loss', 'grad_norm', 'learning_rate', 'eval_loss')


class SoakFailure(AssertionError):
  """Resume lost or changed something: the message says what."""


def train_command(args, workdir: str) -> list[str]:
  """train.py's command line for one start of a soak into workdir: args'
  config, steps and intervals, one log row a step, no sample, and one
  compilation cache for every start (restarts then compile nothing)."""
  flags = [f'--config.num_steps={args.num_steps}',
           f'--config.checkpoint_every={args.checkpoint_every}',
           f'--config.keep_checkpoints={args.keep_checkpoints}',
           f'--config.eval_every={args.eval_every}',
           '--config.log_every=1', '--config.sample.enabled=False']
  if args.data_dir:
    flags.append(f'--config.data.data_dir={args.data_dir}')
  return [sys.executable, os.path.join(ROOT, 'train.py'),
          '--config', args.config, '--workdir', workdir,
          '--compilation_cache_dir',
          os.path.join(args.workdir, 'xla_cache'),
          *flags, *args.overrides]


def final_state(workdir: str, step: int):
  """(train state, data-iterator state) of workdir's checkpoint at step."""
  cfg = checkpoint.load_config(workdir)
  vocab = data.load_tokenizer(
      os.path.join(workdir, workdir_lib.TOKENIZER_DIR)).vocab_size
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one),
      model_setup.build(cfg, vocab).abstract_state(cfg.seed))
  saver = checkpoint.Checkpointer(workdir, async_save=False)
  try:
    if saver.latest_step() != step:
      raise SoakFailure(f'{workdir} ends at checkpoint step '
                        f'{saver.latest_step()}, not {step}.')
    return saver.restore(abstract, step=step)
  finally:
    saver.close()


def leaf_bytes(x):
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  x = np.asarray(x)
  return str(x.dtype), x.shape, x.tobytes()


def compare_states(reference, got, where: str) -> None:
  """Raises SoakFailure naming the first leaf that differs in any bit."""
  want = jax.tree_util.tree_flatten_with_path(reference[0])
  have = jax.tree_util.tree_flatten_with_path(got[0])
  if [p for p, _ in want[0]] != [p for p, _ in have[0]]:
    raise SoakFailure(f'{where}: the final state has other leaves.')
  for (path, a), (_, b) in zip(want[0], have[0]):
    if leaf_bytes(a) != leaf_bytes(b):
      raise SoakFailure(f'{where}: {jax.tree_util.keystr(path)} differs '
                        'from the uninterrupted run.')
  if reference[1] != got[1]:
    raise SoakFailure(f'{where}: the data position differs: {got[1]} vs '
                      f'{reference[1]}.')


def logged(workdir: str) -> list[dict]:
  """Every row of metrics.jsonl, in order, re-logged steps included."""
  path = os.path.join(workdir, 'metrics.jsonl')
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  try:
    return [json.loads(line) for line in lines]
  except json.JSONDecodeError as err:
    raise SoakFailure(f'{path} has a line that is not JSON: {err}.') from err


def compare_metrics(reference: list[dict], got: list[dict],
                    where: str) -> None:
  by_step = {row['step']: row for row in reference}
  for i, row in enumerate(got):
    want = by_step.get(row['step'])
    if want is None:
      raise SoakFailure(f'{where}: logged step {row["step"]}, which the '
                        'uninterrupted run did not.')
    for key in EXACT_METRICS:
      if key not in row and _logged_later(got[i + 1:], row['step'], key):
        continue  # an evaluation a stop signal cut, finished by a restart
      if (key in want or key in row) and want.get(key) != row.get(key):
        raise SoakFailure(f'{where}: {key} at step {row["step"]} is '
                          f'{row.get(key)}, uninterrupted {want.get(key)}.')
  if {row['step'] for row in got} != set(by_step):
    raise SoakFailure(f'{where}: steps logged differ from the '
                      'uninterrupted run.')


def _logged_later(rows: list[dict], step: int, key: str) -> bool:
  """Whether a row of rows re-logs step with key."""
  return any(r['step'] == step and key in r for r in rows)


def check_round(args, reference: str, workdir: str) -> None:
  compare_states(final_state(reference, args.num_steps),
                 final_state(workdir, args.num_steps), workdir)
  compare_metrics(logged(reference), logged(workdir), workdir)
