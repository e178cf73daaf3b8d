"""Sharded train steps, overfitting, and bad configs refused before
compiling."""

import os

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.cli import load_config
from jax_transformer.experiment import Experiment
from jax_transformer.model import sharding
from jax_transformer.train import model_setup, steps, trainer

VOCAB = 64


def lm_batch(b=8, t=16, seed=0):
  rs = np.random.RandomState(seed)
  ids = rs.randint(3, VOCAB, (b, t + 1)).astype(np.int32)
  seg = np.ones((b, t), np.int32)
  seg[1, 10:] = 0
  return {'inputs': ids[:, :-1], 'targets': ids[:, 1:], 'segment_ids': seg,
          'positions': np.broadcast_to(np.arange(t, dtype=np.int32), (b, t))}


def tiny_cfg(**mesh):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.model.update(d_model=32, num_heads=4, num_kv_heads=2, d_ff=64)
  cfg.mesh.update(mesh)
  return cfg


def run_steps(cfg, batch, n=3, devices=None):
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  mesh = sharding.make_mesh(cfg.mesh, devices)
  abstract = setup.abstract_state(cfg.seed)
  shardings, _ = steps.state_shardings(setup, mesh, abstract)
  state = jax.jit(lambda: setup.init_state(cfg.seed),
                  out_shardings=shardings)()
  step = jax.jit(steps.make_train_step(setup.model_def, setup.tx),
                 in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings, NamedSharding(mesh,
                                                         PartitionSpec())))
  losses = []
  for _ in range(n):
    state, metrics = step(state, jax.device_put(
        batch, sharding.batch_sharding(mesh)))
    losses.append(float(metrics['loss'] / metrics['tokens']))
  return state, losses


def test_2x2x2_mesh_step_equals_single_device():
  assert jax.device_count() == 8
  batch = lm_batch()
  one, losses_one = run_steps(tiny_cfg(data=1, fsdp=1, tensor=1), batch,
                              devices=jax.devices()[:1])
  eight, losses_eight = run_steps(tiny_cfg(data=2, fsdp=2, tensor=2), batch)
  wi = eight['params']['layers.0.ff.wi']
  assert wi.sharding.spec == PartitionSpec('fsdp', 'tensor')
  assert len(wi.addressable_shards) == 8
  np.testing.assert_allclose(losses_eight, losses_one, rtol=1e-5)
  for key, value in one['params'].items():
    np.testing.assert_allclose(eight['params'][key], value, atol=1e-5,
                               err_msg=key)


@pytest.mark.slow
def test_loss_falls_when_overfitting_one_batch():
  cfg = tiny_cfg(data=-1)
  cfg.model.dropout_rate = 0.0
  cfg.optim.update(schedule='constant', learning_rate=3e-3, warmup_steps=0)
  _, losses = run_steps(cfg, lm_batch(), n=40)
  assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.slow
def test_encoder_decoder_step_runs_sharded():
  cfg = load_config('translate_ende:tiny')
  cfg.mesh.update(data=2, fsdp=2, tensor=2)
  rs = np.random.RandomState(0)
  b, s, t = 8, 12, 10
  ones = lambda n: np.ones((b, n), np.int32)
  pos = lambda n: np.broadcast_to(np.arange(n, dtype=np.int32), (b, n))
  batch = {'src': rs.randint(3, VOCAB, (b, s)).astype(np.int32),
           'src_segment_ids': ones(s), 'src_positions': pos(s),
           'tgt_in': rs.randint(3, VOCAB, (b, t)).astype(np.int32),
           'tgt_out': rs.randint(3, VOCAB, (b, t)).astype(np.int32),
           'tgt_segment_ids': ones(t), 'tgt_positions': pos(t)}
  eight, losses = run_steps(cfg, batch, n=2)
  cfg.mesh.update(data=1, fsdp=1, tensor=1)
  one, losses_one = run_steps(cfg, batch, n=2, devices=jax.devices()[:1])
  np.testing.assert_allclose(losses, losses_one, rtol=1e-5)
  for key, value in one['params'].items():
    if key.endswith('key_bias'):
      # Softmax ignores a shift shared by all keys: this gradient is zero up
      # to rounding, which Adam's normalisation blows up to full-size steps.
      continue
    # Adam also magnifies rounding in other near-zero gradients a little.
    np.testing.assert_allclose(eight['params'][key], value, atol=1e-4,
                               err_msg=key)


@pytest.mark.parametrize('change, message', [
    (lambda c: c.model.update(num_heads=3), 'not divisible by num_heads=3'),
    (lambda c: c.mesh.update(data=16), 'config.mesh asks for 16 devices but'),
    (lambda c: c.mesh.update(data=2, fsdp=1, tensor=4),
     "mesh axis 'tensor' of size 4 does not divide"),
    (lambda c: setattr(c, 'batch_size', 6), 'Batch size 6 is not divisible'),
    (lambda c: setattr(c, 'seq_len', 65), 'config.seq_len=65 exceeds model'),
])
def test_bad_configs_fail_in_one_sentence_before_compiling(
    change, message, tmp_path, monkeypatch):
  cfg = tiny_cfg(data=-1)
  cfg.model.num_kv_heads = 2
  change(cfg)
  # Stand-in data so the test needs no corpus; compiling would call jit.
  monkeypatch.setattr(trainer, 'prepare_data', lambda cfg: FakePrepared())
  monkeypatch.setattr(jax, 'jit', forbidden_jit)
  with pytest.raises(ValueError) as err:
    trainer.train_and_evaluate(cfg, str(tmp_path))
  assert message in str(err.value)
  assert '\n' not in str(err.value)


@pytest.mark.parametrize('field', ['log_every', 'eval_every',
                                   'checkpoint_every', 'keep_checkpoints',
                                   'num_steps'])
def test_non_positive_run_fields_refused_before_data(field, tmp_path,
                                                     monkeypatch):
  cfg = tiny_cfg(data=-1)
  setattr(cfg, field, 0)
  monkeypatch.setattr(trainer, 'prepare_data', forbidden_prepare)
  with pytest.raises(ValueError) as err:
    trainer.train_and_evaluate(cfg, str(tmp_path))
  assert str(err.value) == (f'config.{field} must be an integer >= 1, '
                            'got 0.')
  assert not os.listdir(tmp_path)


def forbidden_prepare(cfg):
  raise AssertionError('prepared data before validating the config')


class FakePrepared:
  class tokenizer:  # noqa: N801
    vocab_size = VOCAB


def forbidden_jit(*args, **kwargs):
  raise AssertionError('compiled before validating the config')


def test_resume_allows_runtime_fields_and_refuses_state_fields(tmp_path):
  saved = tiny_cfg()
  del saved.model['dropout_rng']  # a workdir written before the field
  with open(tmp_path / 'config.json', 'w') as f:
    f.write(saved.to_json())
  cfg = tiny_cfg()
  cfg.model.update(dtype='bfloat16', dropout_rate=0.3, dropout_rng='threefry')
  trainer.check_resumable(Experiment.of(cfg), str(tmp_path))  # compute only: resumable
  cfg.model.d_ff = 128
  with pytest.raises(ValueError, match=r'different config.model \(d_ff\)'):
    trainer.check_resumable(Experiment.of(cfg), str(tmp_path))


@pytest.mark.slow
def test_steps_run_alone_or_two_in_flight_to_the_same_bits(
    tmp_path, monkeypatch, fake_data_dir):
  """trainer.SLOW_STEP_S only changes when the host waits, never a
  result: every step alone (0 s) equals the usual two in flight."""
  from jax_transformer.model.params import split
  from jax_transformer.workdirs import restore

  def final_params(name, slow_step_s):
    monkeypatch.setattr(trainer, 'SLOW_STEP_S', slow_step_s)
    cfg = load_config('lm_shakespeare:tiny')
    cfg.data.data_dir = fake_data_dir
    cfg.sample.enabled = False
    cfg.update(num_steps=5, log_every=5, eval_every=5, checkpoint_every=5)
    last = trainer.train_and_evaluate(cfg, str(tmp_path / name))
    model, _ = restore.load_for_inference(str(tmp_path / name))
    return last['loss'], jax.device_get(split(model)[1])

  alone = final_params('alone', 0.0)
  queued = final_params('queued', float('inf'))
  assert alone[0] == queued[0]
  for name, value in queued[1].items():
    np.testing.assert_array_equal(alone[1][name], value, err_msg=name)
