"""optim.max_skipped_updates: a step with a non-finite loss or gradient
changes nothing but two counters; training stops after N in a row."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import ConfigDict
from test_grad_accumulation import VOCAB, T
from test_grad_accumulation import lm_batch as batch_of

from jax_transformer.cli import load_config
from jax_transformer.experiment import Experiment
from jax_transformer.train import (
  checkpoint,
  finite,
  metrics,
  model_setup,
  optim,
  steps,
  trainer,
)


def lm_batch(seed):
  return batch_of([T, 5, T, 9], seed)


def tiny_setup(max_skipped, accum=1):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.model.dropout_rate = 0.0
  cfg.optim.update(max_skipped_updates=max_skipped, grad_accum_steps=accum,
                   warmup_steps=0, schedule='constant')
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  step = jax.jit(steps.make_train_step(setup.model_def, setup.tx))
  return setup, step, setup.init_state(cfg.seed)


def poison(params):
  """params with a NaN in the embedding: the loss and gradients turn NaN."""
  table = params['embed.embedding']
  return dict(params, **{'embed.embedding': table.at[3, 0].set(jnp.nan)})


def assert_trees_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


def counters(state):
  return tuple(int(getattr(state['opt_state'], k))
               for k in optim.SKIP_COUNTERS)


def test_a_non_finite_step_changes_nothing_but_the_counters(tmp_path):
  setup, step, start = tiny_setup(max_skipped=3)
  bad = dict(start, params=poison(start['params']))
  after, m = step(bad, lm_batch(0))
  assert not np.isfinite(float(m['loss']))
  assert_trees_equal(after['params'], bad['params'])
  assert_trees_equal(after['opt_state'].inner, bad['opt_state'].inner)
  assert int(after['step']) == 1
  assert counters(after) == (1, 1)
  assert (int(m['consecutive_skips']), int(m['skipped_updates'])) == (1, 1)
  after, _ = step(after, lm_batch(1))
  assert counters(after) == (2, 2)

  # The counters are checkpointed with the optimizer state.
  saver = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  saver.save(after, {'position': 2})
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restored, _ = saver.restore(jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one),
      setup.abstract_state(0)))
  saver.close()
  assert counters(restored) == (2, 2)

  # A finite step is applied and ends the run of skips.
  good, m = step(dict(restored, params=start['params']), lm_batch(2))
  assert counters(good) == (0, 2)
  assert int(good['step']) == 3
  assert not np.array_equal(good['params']['embed.embedding'],
                            start['params']['embed.embedding'])


def test_a_non_finite_loss_alone_is_skipped():
  tx = optim.skip_non_finite(optax.sgd(1.0))
  params = {'w': jnp.ones(2)}
  state = tx.init(params)
  updates, state = tx.update({'w': jnp.ones(2)}, state, params,
                             loss=jnp.float32(jnp.inf))
  np.testing.assert_array_equal(updates['w'], 0.0)
  assert (int(state.consecutive_skips), int(state.skipped_updates)) == (1, 1)
  updates, state = tx.update({'w': jnp.ones(2)}, state, params,
                             loss=jnp.float32(2.0))
  np.testing.assert_array_equal(updates['w'], -1.0)
  assert (int(state.consecutive_skips), int(state.skipped_updates)) == (0, 1)


def test_a_skipped_micro_batch_is_left_out_of_the_accumulation():
  """grad_accum_steps=2: good, non-finite, good gives the update of the
  two good micro-batches."""
  _, step, start = tiny_setup(max_skipped=2, accum=2)
  clean, _ = step(start, lm_batch(0))
  skipped, _ = step(dict(clean, params=poison(clean['params'])), lm_batch(1))
  skipped = dict(skipped, params=clean['params'])
  with_skip, _ = step(skipped, lm_batch(2))
  without, _ = step(clean, lm_batch(2))
  assert not np.array_equal(without['params']['embed.embedding'],
                            start['params']['embed.embedding'])
  assert_trees_equal(with_skip['params'], without['params'])
  assert_trees_equal(with_skip['opt_state'].inner, without['opt_state'].inner)
  assert counters(with_skip) == (0, 1)


class FakeCheckpointer:
  def wait(self):
    pass

  def latest_step(self):
    return 4


def test_check_finite_stops_after_max_skipped_in_a_row():
  row = {'loss': np.nan, 'grad_norm': np.nan, 'consecutive_skips': 2,
         'skipped_updates': 5}
  finite.check_finite(row, 7, FakeCheckpointer(), max_skipped=3)
  with pytest.raises(FloatingPointError, match=(
      r'^The 3 steps up to step 8 all had a non-finite loss or gradient norm '
      r'and were skipped \(optim.max_skipped_updates=3; 6 skipped since '
      r'step 0\); training stopped without saving it \(the last checkpoint '
      r'is step 4\)')):
    finite.check_finite(dict(row, consecutive_skips=3, skipped_updates=6),
                         8, FakeCheckpointer(), max_skipped=3)


def test_check_finite_without_skipping_stops_at_the_first():
  ok = {'loss': 1.0, 'grad_norm': 2.0, 'consecutive_skips': 0,
        'skipped_updates': 0}
  finite.check_finite(ok, 4, FakeCheckpointer())
  with pytest.raises(FloatingPointError, match=r'^Step 5 gave a non-finite'):
    finite.check_finite(dict(ok, loss=np.nan), 5, FakeCheckpointer())


@pytest.mark.parametrize('value', [-1, 1.5, True, '3', None])
def test_max_skipped_updates_is_checked_before_any_data(value, monkeypatch):
  cfg = load_config('lm_shakespeare:tiny')
  assert cfg.optim.max_skipped_updates == 0  # settable from the command line
  # A new ConfigDict: the default's type (int) would refuse 1.5 and '3'.
  cfg.optim = ConfigDict(dict(cfg.optim.to_dict(), max_skipped_updates=value))

  def prepare(_):
    raise AssertionError('data prepared before the config was checked')

  monkeypatch.setattr(trainer, 'prepare_data', prepare)
  with pytest.raises(ValueError, match=(
      r'^config.optim.max_skipped_updates must be an integer >= 0 '
      r'\(0: stop at the first non-finite step\), got ')):
    trainer.train_and_evaluate(cfg, '/nonexistent/workdir')


def poison_steps(monkeypatch, bad_steps):
  """The trainer's train step, with a NaN in the embedding on the given
  steps (counting from 1); a skipped step hands the NaN back, so the real
  table is put back after it."""
  make = steps.make_train_step

  def patched(*args, **kwargs):
    step = make(*args, **kwargs)

    def run(state, batch):
      hit = jnp.isin(state['step'] + 1, jnp.array(bad_steps))
      real = state['params']['embed.embedding']
      bad = jnp.where(hit, poison(state['params'])['embed.embedding'], real)
      new, m = step(dict(state, params=dict(state['params'],
                                            **{'embed.embedding': bad})),
                    batch)
      kept = jnp.where(hit, real, new['params']['embed.embedding'])
      return dict(new, params=dict(new['params'],
                                   **{'embed.embedding': kept})), m
    return run

  monkeypatch.setattr(steps, 'make_train_step', patched)


def tiny_run(tmp_path, max_skipped, checkpoint_every):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = str(tmp_path / 'tfds')
  cfg.update(num_steps=8, checkpoint_every=checkpoint_every, log_every=2,
             eval_every=100)
  cfg.optim.max_skipped_updates = max_skipped
  cfg.sample.enabled = False
  return cfg, str(tmp_path / 'w')


@pytest.mark.slow
def test_training_skips_then_stops_after_max_skipped(tmp_path, monkeypatch):
  """Step 3 is skipped and training goes on; steps 5 and 6 make two in a
  row, which stops it naming step 6 (logged, not saved) and checkpoint 4."""
  poison_steps(monkeypatch, [3, 5, 6])
  cfg, work = tiny_run(tmp_path, max_skipped=2, checkpoint_every=4)
  with pytest.raises(FloatingPointError, match=(
      r'^The 2 steps up to step 6 .* 3 skipped since step 0\); .*the last '
      r'checkpoint is step 4\)')):
    trainer.train_and_evaluate(cfg, work)
  assert sorted(os.listdir(os.path.join(work, 'checkpoints'))) == ['4']
  rows = {r['step']: r for r in metrics.read_jsonl(work)}
  assert (rows[2]['skipped_updates'], rows[4]['skipped_updates'],
          rows[6]['skipped_updates']) == (0, 1, 3)
  assert (rows[4]['consecutive_skips'], rows[6]['consecutive_skips']) == (0, 2)
  assert np.isfinite(rows[2]['loss'])


@pytest.mark.slow
def test_without_skipping_training_stops_at_the_first(tmp_path, monkeypatch):
  poison_steps(monkeypatch, [3])
  cfg, work = tiny_run(tmp_path, max_skipped=0, checkpoint_every=2)
  with pytest.raises(FloatingPointError, match=(
      r'^Step 3 gave a non-finite .*the last checkpoint is step 2\)')):
    trainer.train_and_evaluate(cfg, work)
  assert sorted(os.listdir(os.path.join(work, 'checkpoints'))) == ['2']
