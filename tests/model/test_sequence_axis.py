"""The 'sequence' mesh axis (context parallelism): a row's positions split
over devices, keys and values gathered for attention, and the loss and its
gradients those of one device, with padding and with packed segments."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.cli import load_config
from jax_transformer.decoding.api import generate
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.model import sharding
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM
from jax_transformer.train import model_setup, run_plan, steps, trainer

# One xdist worker for the module: the one-device programs compile once.
pytestmark = pytest.mark.xdist_group('sequence_axis')

VOCAB, B, T = 64, 8, 32


def _config(**mesh):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.model.update(d_model=32, num_heads=4, num_kv_heads=2, d_ff=64,
                   dropout_rate=0.0, positional='rotary')
  cfg.update(seq_len=T, batch_size=B, eval_batch_size=B)
  cfg.mesh.update({'data': 1, **mesh})
  return cfg


def _batch(packed: bool):
  """Rows of random tokens: right-padded rows of different lengths, or
  rows packed with two or three segments and padding at the end."""
  rs = np.random.RandomState(1)
  ids = rs.randint(3, VOCAB, (B, T + 1)).astype(np.int32)
  seg = np.zeros((B, T), np.int32)
  pos = np.zeros((B, T), np.int32)
  for b in range(B):
    if packed:
      # Segments cross the shard boundaries (T / 8 = 4 positions a shard).
      cuts = [0, 5 + b, 19 + b // 2, T - b]
    else:
      cuts = [0, T - 3 * b]
    for s, (start, end) in enumerate(zip(cuts, cuts[1:])):
      seg[b, start:end] = s + 1
      pos[b, start:end] = np.arange(end - start)
  return {'inputs': ids[:, :-1], 'targets': ids[:, 1:], 'segment_ids': seg,
          'positions': pos}


def _translation_config(**mesh):
  cfg = load_config('translate_ende:tiny')
  cfg.model.update(d_model=32, num_heads=4, d_ff=64, dropout_rate=0.0)
  cfg.update(seq_len=T, batch_size=B, eval_batch_size=B)
  cfg.data.src_len = T // 2
  cfg.mesh.update({'data': 1, **mesh})
  return cfg


def _translation_batch(packed: bool):
  """Source rows of T / 2 and target rows of T, from _batch's rows."""
  lm = _batch(packed)
  half = {k: v[:, :T // 2] for k, v in _batch(not packed).items()}
  return {'src': half['inputs'], 'src_segment_ids': half['segment_ids'],
          'src_positions': half['positions'], 'tgt_in': lm['inputs'],
          'tgt_out': lm['targets'], 'tgt_segment_ids': lm['segment_ids'],
          'tgt_positions': lm['positions']}


def _sharded_start(cfg, devices=None):
  """(setup, mesh, state shardings, fresh parameters placed on them) of a
  config on its mesh over devices (default all)."""
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  mesh = sharding.make_mesh(cfg.mesh, devices)
  shardings, _ = steps.state_shardings(setup, mesh,
                                       setup.abstract_state(cfg.seed))
  params = jax.jit(lambda: setup.init_state(cfg.seed)['params'],
                   out_shardings=shardings['params'])()
  return setup, mesh, shardings, params


def _loss_and_grads(mesh_sizes, packed: bool, chunk: int,
                    translation: bool = False):
  """(loss per token, gradients by parameter) of one batch on the mesh."""
  cfg = (_translation_config if translation else _config)(**mesh_sizes)
  devices = None if np.prod(list(mesh_sizes.values())) > 1 else \
      jax.devices()[:1]
  setup, mesh, shardings, params = _sharded_start(cfg, devices)

  def loss(p, batch):
    sums = steps.loss_sums(setup.model_def.merge(p), batch, True,
                           packed=packed, loss_chunk_size=chunk)
    return sums['loss'] / sums['tokens']

  grad = jax.jit(jax.value_and_grad(loss),
                 in_shardings=(shardings['params'],
                               sharding.batch_sharding(mesh)),
                 out_shardings=(NamedSharding(mesh, PartitionSpec()),
                                shardings['params']))
  batch = (_translation_batch if translation else _batch)(packed)
  batch = jax.device_put(batch, sharding.batch_sharding(mesh))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    value, grads = grad(params, batch)
  return float(value), jax.tree.map(np.asarray, grads)


_ONE_DEVICE = {}


def _one_device(packed, chunk, translation=False):
  key = (packed, chunk, translation)
  if key not in _ONE_DEVICE:
    _ONE_DEVICE[key] = _loss_and_grads({}, packed, chunk, translation)
  return _ONE_DEVICE[key]


def _assert_same(got, want):
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  assert set(got[1]) == set(want[1])
  # Gradients that are zero in exact arithmetic (a key bias shifts every
  # score of a query alike) are rounding noise: compared against the
  # largest gradient, not their own.
  scale = max(np.abs(value).max() for value in want[1].values())
  for name, value in want[1].items():
    np.testing.assert_allclose(got[1][name], value, rtol=1e-5,
                               atol=1e-6 * scale, err_msg=name)


@pytest.mark.parametrize('mesh_sizes, packed, chunk', [
    ({'sequence': 2, 'data': 4}, False, 0),
    ({'sequence': 2, 'fsdp': 4}, True, 16),
    ({'sequence': 2, 'data': 2, 'tensor': 2}, True, 0),
    ({'sequence': 4, 'fsdp': 2}, False, 16),
    ({'sequence': 4, 'tensor': 2}, True, 16),
    ({'sequence': 8}, False, 16),
    ({'sequence': 8}, True, 0),
])
def test_split_rows_give_the_loss_and_gradients_of_one_device(
    mesh_sizes, packed, chunk):
  _assert_same(_loss_and_grads(mesh_sizes, packed, chunk),
               _one_device(packed, chunk))


@pytest.mark.parametrize('mesh_sizes, packed', [
    ({'sequence': 2, 'data': 2, 'tensor': 2}, False),
    ({'sequence': 4, 'fsdp': 2}, True),
])
def test_the_encoder_decoder_splits_its_rows_the_same_way(mesh_sizes,
                                                         packed):
  """Source and target rows both split; cross-attention reads the whole
  source (its keys and values gathered like self-attention's)."""
  _assert_same(_loss_and_grads(mesh_sizes, packed, 0, translation=True),
               _one_device(packed, 0, translation=True))


def test_attention_gathers_keys_and_values_and_nothing_else():
  """Under sequence 4, the forward pass's only gathers over positions are
  attention's keys and values; the MLP, norms and loss stay split."""
  setup, mesh, shardings, params = _sharded_start(
      _config(sequence=4, data=2))

  def loss(p, batch):
    sums = steps.loss_sums(setup.model_def.merge(p), batch, True,
                           loss_chunk_size=16)
    return sums['loss']

  step = jax.jit(jax.grad(loss), in_shardings=(
      shardings['params'], sharding.batch_sharding(mesh)))
  batch = jax.device_put(_batch(True), sharding.batch_sharding(mesh))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    hlo = step.lower(params, batch).compile().as_text()
  gathers = [line for line in hlo.splitlines() if ' all-gather(' in line]
  # Keys and values [B / 2, T, K, H], once each (the layers are scanned).
  kv = f'f32[{B // 2},{T},2,8]'
  assert gathers and all(kv in line for line in gathers), gathers
  # The MLP's hidden layer is computed on a quarter of each row.
  assert f'f32[{B // 2 * T // 4},64]' in hlo


def test_the_report_and_the_memory_estimate_show_the_axis():
  exp = Experiment.of(_config(sequence=4, data=2))
  mesh = run_plan.mesh_for(exp)
  assert dict(mesh.shape) == {'data': 2, 'fsdp': 1, 'sequence': 4,
                              'tensor': 1}
  plan = run_plan.build(exp, mesh, VOCAB)
  report = sharding.report(plan.setup.abstract_params,
                           plan.setup.model_def.logical_axes,
                           plan.param_specs, mesh)
  assert report.splitlines()[-1] == (
      'activations [B, T, D]: the batch split 2 ways over data x fsdp, each '
      "row's positions split 4 ways over sequence, keys and values gathered "
      'for attention')
  # The same rows on two devices without the axis: every token's
  # activations but the gathered keys and values are divided by 4.
  two = sharding.make_mesh({'data': 2}, jax.devices()[:2])
  whole = run_plan.build(Experiment.of(_config(data=2)), two, VOCAB)
  ratio = plan.estimate.activations / whole.estimate.activations
  assert 0.25 < ratio < 0.4, ratio


def test_a_row_the_axis_does_not_divide_is_refused_before_any_data(
    tmp_path, monkeypatch):
  cfg = _config(sequence=8)
  cfg.seq_len = 36

  def forbidden(*args, **kwargs):
    raise AssertionError('prepared data before refusing the mesh')

  monkeypatch.setattr(trainer, 'prepare_data', forbidden)
  with pytest.raises(UsageError) as err:
    trainer.train_and_evaluate(cfg, str(tmp_path))
  assert str(err.value) == (
      'config.seq_len=36 is not divisible by --config.mesh.sequence=8, '
      'which splits every row into that many parts; make it a multiple.')


def test_the_batch_splits_over_data_and_fsdp_only():
  mesh = sharding.make_mesh({'data': 1, 'fsdp': 2, 'sequence': 4})
  sharding.check_batch(2, mesh)  # 2 rows: one per fsdp shard
  with pytest.raises(UsageError, match='2 data x fsdp shards'):
    sharding.check_batch(3, mesh)


def test_decoding_on_a_mesh_with_the_axis_gives_the_tokens_of_none():
  """A workdir trained with sequence > 1 is decoded on its training mesh
  (``restore.inference_mesh``): prefill splits the prompt's positions,
  the cache steps do not, and greedy tokens are those of no mesh."""
  model = DecoderLM(ModelConfig(
      vocab_size=VOCAB, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64,
      num_decoder_layers=2, max_len=64, positional='rotary',
      dropout_rate=0.0), nnx.Rngs(0))
  ids = np.random.RandomState(0).randint(3, VOCAB, (B, 16)).astype(np.int32)
  mask = np.ones((B, 16), bool)
  mask[1, 12:] = False
  want = generate(model, ids, mask, max_new_tokens=8, eos_id=None)
  got = generate(model, ids, mask, max_new_tokens=8, eos_id=None,
                 mesh=sharding.make_mesh({'data': 2, 'sequence': 4}))
  np.testing.assert_array_equal(np.asarray(got.tokens),
                                np.asarray(want.tokens))
