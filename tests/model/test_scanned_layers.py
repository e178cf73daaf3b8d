"""Scanned layers and remat: same numerics as the unrolled stack, and every
consumer of parameters (checkpoints, torch_compat, export, decoding, the
sharding report) works in both layouts."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jax_transformer import decoding
from jax_transformer.interop import torch_compat
from jax_transformer.model import params, sharding
from jax_transformer.model.config import ModelConfig, gpt2_small
from jax_transformer.model.models import DecoderLM, EncoderDecoder
from jax_transformer.train import checkpoint, steps

# One xdist worker for the module: _loss_and_grads's cache then serves the
# dropout test's no-dropout step (DecoderLM scanned, remat 'dots') from the
# layout test's.
pytestmark = pytest.mark.xdist_group('scanned_layers')

V, B, T = 48, 2, 7
CONFIG = ModelConfig(vocab_size=V, d_model=16, num_heads=4, num_kv_heads=2,
                     d_ff=32, num_encoder_layers=2, num_decoder_layers=3,
                     dropout_rate=0.0, attention_dropout_rate=0.0,
                     positional='rotary', norm_first=True, max_len=16)
# Each model's unrolled stack without remat is the reference; the other
# five (scan, remat) layouts are split between the two models so that every
# (scan, remat) pair is checked once, and each model meets both layouts and
# all three remat policies (the reference gives each its 'none' and its
# unrolled stack). The full 2 x 3 grid per model compiled twelve steps
# for the same stack.py paths.
LAYOUTS = {
    DecoderLM: [(False, 'full'), (True, 'none'), (True, 'dots')],
    EncoderDecoder: [(False, 'dots'), (True, 'full')],
}


def _batch(kind):
  rs = np.random.RandomState(0)
  ids = lambda: jnp.asarray(rs.randint(3, V, (B, T)), jnp.int32)
  seg = jnp.asarray([[1] * T, [1] * 4 + [0] * 3], jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(T), (B, T)) * seg
  if kind == 'lm':
    return {'inputs': ids(), 'targets': ids(), 'segment_ids': seg,
            'positions': pos}
  return {'src': ids(), 'src_segment_ids': seg, 'src_positions': pos,
          'tgt_in': ids(), 'tgt_out': ids(), 'tgt_segment_ids': seg,
          'tgt_positions': pos}


def _model(cls, scan=False, remat='none', **changes):
  return cls(CONFIG.replace(scan_layers=scan, remat=remat, **changes),
             nnx.Rngs(0))


@pytest.mark.parametrize('cls', [DecoderLM, EncoderDecoder])
def test_scanned_model_starts_from_the_unrolled_parameters(cls):
  _, unrolled = params.split(_model(cls))
  _, scanned = params.split(_model(cls, scan=True))
  assert params.is_scanned(scanned) and not params.is_scanned(unrolled)
  assert scanned['layers.ff.wi' if cls is DecoderLM
                 else 'decoder_layers.ff.wi'].shape == (3, 16, 32)
  converted = params.scanned(unrolled)
  assert sorted(converted) == sorted(scanned)
  for name in scanned:
    np.testing.assert_array_equal(converted[name], scanned[name])
  back = params.unrolled(scanned)
  assert sorted(back) == sorted(unrolled)
  for name in unrolled:
    np.testing.assert_array_equal(back[name], unrolled[name])


@functools.cache  # each layout's step is compiled and run once
def _loss_and_grads(cls, scan, remat, dropout=0.0):
  model = _model(cls, scan, remat, dropout_rate=dropout)
  model_def, p = params.split(model)
  batch = _batch('lm' if cls is DecoderLM else 'translation')

  def loss(p):
    sums = steps.loss_sums(model_def.merge(p), batch, dropout == 0.0,
                           nnx.Rngs(dropout=jax.random.key(3)),
                           label_smoothing=0.1)
    return sums['loss'] / sums['tokens']

  value, grads = jax.jit(jax.value_and_grad(loss))(p)
  return value, params.unrolled(grads)


@pytest.mark.slow
@pytest.mark.parametrize('cls', [DecoderLM, EncoderDecoder])
def test_every_layout_and_remat_policy_gives_the_same_loss_and_gradients(
    cls):
  want, want_grads = _loss_and_grads(cls, False, 'none')
  for scan, remat in LAYOUTS[cls]:
    got, grads = _loss_and_grads(cls, scan, remat)
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=(scan, remat))
    for name in want_grads:
      np.testing.assert_allclose(grads[name], want_grads[name], rtol=1e-4,
                                 atol=1e-6, err_msg=(scan, remat, name))


@pytest.mark.slow
def test_dropout_is_the_same_scanned_or_unrolled_under_remat():
  """Scan and remat give each layer its own key: the same masks either way
  (the plain loop keeps drawing call by call, as before)."""
  want, want_grads = _loss_and_grads(DecoderLM, False, 'full', dropout=0.3)
  got, grads = _loss_and_grads(DecoderLM, True, 'dots', dropout=0.3)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for name in want_grads:
    np.testing.assert_allclose(grads[name], want_grads[name], rtol=1e-4,
                               atol=1e-6)
  no_dropout, _ = _loss_and_grads(DecoderLM, True, 'dots')
  assert abs(float(got) - float(no_dropout)) > 1e-3


@pytest.mark.slow
def test_remat_saves_less_for_the_backward_pass():
  """XLA's temporaries for the gradient: full < dots < none."""
  def temp_bytes(remat):
    model = DecoderLM(CONFIG.replace(d_model=64, d_ff=256, scan_layers=True,
                                     remat=remat, num_decoder_layers=6,
                                     max_len=128), nnx.Rngs(0))
    model_def, p = params.split(model)
    ids = jnp.zeros((8, 128), jnp.int32)
    loss = lambda p: model_def.merge(p)(ids).sum()
    compiled = jax.jit(jax.grad(loss)).lower(p).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  none, dots, full = (temp_bytes(r) for r in ('none', 'dots', 'full'))
  assert full < dots < none, (full, dots, none)


def test_layout_conversion_reaches_optimizer_state_and_shardings():
  _, p = params.split(_model(DecoderLM))
  tx = optax.adamw(1e-3)
  state = {'params': p, 'opt_state': tx.init(p), 'step': jnp.int32(0)}
  stacked = params.to_layout(state, True)
  _, scanned = params.split(_model(DecoderLM, scan=True))
  assert (jax.tree.structure(stacked) ==
          jax.tree.structure({'params': scanned,
                              'opt_state': tx.init(scanned),
                              'step': jnp.int32(0)}))
  mesh = sharding.make_mesh({'data': 1, 'fsdp': 2, 'tensor': 4})
  spec = jax.sharding.PartitionSpec('fsdp', 'tensor')
  abstract = {'layers.0.ff.wi': jax.ShapeDtypeStruct(
      (16, 32), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, spec))}
  abstract['layers.1.ff.wi'] = abstract['layers.0.ff.wi']
  got = params.scanned(abstract)['layers.ff.wi']
  assert got.shape == (2, 16, 32)
  assert got.sharding.spec == jax.sharding.PartitionSpec(None, 'fsdp',
                                                         'tensor')
  assert params.unrolled({'layers.ff.wi': got})['layers.1.ff.wi'] == (
      abstract['layers.1.ff.wi'])


@pytest.mark.parametrize('saved_scan', [False, True])
def test_checkpoint_restores_in_the_other_layout(tmp_path, saved_scan):
  tx = optax.adam(1e-3)
  _, p = params.split(_model(DecoderLM, scan=saved_scan))
  state = {'params': p, 'opt_state': tx.init(p), 'step': jnp.int32(5),
           'rng': jnp.zeros(2, jnp.uint32)}
  state = jax.tree.map(lambda x: x + 1 if x.dtype == jnp.float32 else x,
                       state)  # moments non-zero
  saver = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  saver.save(state, {'position': 3})
  saver.close()
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = params.to_layout(state, not saved_scan)
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), target)
  loader = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  assert loader.saved_scanned(5) == saved_scan
  restored, data_state = loader.restore(abstract)
  only_params = loader.restore_params(abstract['params'])
  loader.close()
  assert data_state == {'position': 3}
  assert jax.tree.structure(restored) == jax.tree.structure(target)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
    np.testing.assert_array_equal(got, want)
  for name in target['params']:
    np.testing.assert_array_equal(only_params[name], target['params'][name])


def test_torch_compat_and_safetensors_names_do_not_depend_on_layout(tmp_path):
  config = gpt2_small(vocab_size=V, d_model=16, num_heads=4, d_ff=32,
                      num_decoder_layers=3, max_len=16)
  unrolled = DecoderLM(config, nnx.Rngs(0))
  scanned = DecoderLM(config.replace(scan_layers=True), nnx.Rngs(0))
  want = torch_compat.decoder_lm_to_gpt2(unrolled)
  got = torch_compat.decoder_lm_to_gpt2(scanned)
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key])
  back = torch_compat.decoder_lm_from_gpt2(want,
                                           config.replace(scan_layers=True))
  assert params.is_scanned(params.split(back)[1])
  ids = jnp.asarray(np.random.RandomState(0).randint(0, V, (B, T)))
  np.testing.assert_allclose(back(ids), unrolled(ids), rtol=1e-5, atol=1e-5)
  flat = params.split(scanned)[1]
  rebuilt = torch_compat.module_from_flat(
      params.unrolled(flat), lambda: DecoderLM(config.replace(
          scan_layers=True), nnx.Rngs(1)))
  np.testing.assert_allclose(rebuilt(ids), unrolled(ids), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('cls', [
    DecoderLM, pytest.param(EncoderDecoder, marks=pytest.mark.slow)])
def test_decoding_gives_the_same_tokens_in_both_layouts(cls):
  rs = np.random.RandomState(2)
  ids = jnp.asarray(rs.randint(3, V, (B, 4)), jnp.int32)
  kwargs = ({'prompt_ids': ids} if cls is DecoderLM
            else {'src_ids': ids})
  outs = [decoding.generate(_model(cls, scan), max_new_tokens=6,
                            eos_id=None, **kwargs).tokens
          for scan in (False, True)]
  np.testing.assert_array_equal(outs[0], outs[1])


def test_sharding_report_gives_the_layer_axis_no_mesh_axis():
  model_def, abstract = params.abstract(
      lambda: DecoderLM(CONFIG.replace(scan_layers=True), nnx.Rngs(0)))
  axes = model_def.logical_axes
  assert axes['layers.ff.wi'] == ('layers', 'embed', 'mlp')
  specs = sharding.param_specs(axes)
  assert specs['layers.ff.wi'] == jax.sharding.PartitionSpec(
      None, 'fsdp', 'tensor')
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})
  assert 'layers.ff.wi' in sharding.report(abstract, axes, specs, mesh)
