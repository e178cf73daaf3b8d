"""Causal rows split over the 'sequence' axis, reordered so that each shard
holds chunks i and 2n - 1 - i (model/balance.py): splash's block tables
then give every shard the same number of key blocks, and attention, the
model and the training loss are those of rows in order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer.model import attention, balance, sharding, split_rows
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.masks import Mask
from jax_transformer.model.models import DecoderLM
from jax_transformer.train import steps
from tests.model.test_split_row_kernels import (
  T,
  _assert_equal,
  _inputs,
  _mask,
  _reference,
  _split,
)


def test_balanced_order_holds_chunks_i_and_2n_minus_1_minus_i():
  assert balance.row_positions(8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
  x = jnp.arange(2 * 24).reshape(2, 24)
  assert balance.balanced(x, 3)[0].tolist() == (
      [0, 1, 2, 3, 20, 21, 22, 23, 4, 5, 6, 7, 16, 17, 18, 19,
       8, 9, 10, 11, 12, 13, 14, 15])
  np.testing.assert_array_equal(
      balance.in_row_order(balance.balanced(x, 3), 3), x)


def _blocks_per_shard(info, shards: int) -> list[int]:
  """Key blocks a splash kernel's shards visit: its block table's
  non-empty entries [heads, q blocks, kv blocks], summed per query shard."""
  visited = np.asarray(info.block_mask)[0] > 0
  return [int(part.sum()) for part in np.split(visited, shards, axis=0)]


def test_each_shard_of_a_balanced_row_visits_as_many_key_blocks():
  """At 4,096 tokens over 4 shards (blocks of 512): in row order the
  shards visit 3, 7, 11 and 15 key blocks, balanced 9 each; in the
  forward pass and in the backward pass's dq and dkv."""
  length, shards = 4096, 4
  in_order = attention.splash._kernel(4, length, True, False, True, shards)
  balanced = attention.splash._kernel(4, length, True, False, True, shards,
                                      True)
  for info in ('fwd_mask_info', 'dq_mask_info'):
    assert _blocks_per_shard(getattr(in_order, info), shards) == [3, 7, 11, 15]
    assert _blocks_per_shard(getattr(balanced, info), shards) == [9] * 4
  # dkv's table is [heads, q blocks, kv blocks] too, walked by key block.
  assert _blocks_per_shard(balanced.dkv_mask_info, shards) == [9] * 4


def _balanced_inputs(q, mask, shards):
  """The queries and the mask of a balanced row."""
  q_bal = balance.balanced(jnp.asarray(q), shards)
  if mask.query_segments is not None:
    segments = balance.balanced(mask.query_segments, shards)
    mask = Mask(causal=True, query_segments=segments,
                key_segments=segments)
  return q_bal, mask.balanced_rows(shards)


def _in_row_order_of(got, shards):
  """Loss and gradients of a balanced row, dq put back in row order."""
  loss, (dq, dk, dv) = got
  return loss, (balance.in_row_order(dq, shards), dk, dv)


@pytest.mark.parametrize('kind', ['causal', 'padded', 'packed'])
@pytest.mark.parametrize('backend,shards', [('splash', 2), ('cudnn', 4)])
def test_balanced_rows_per_shard_equal_whole_rows(kind, backend, shards):
  """Splash (interpreted) and the per-shard masks cuDNN runs on (XLA's
  kernel in its place) over balanced rows: the loss and gradients of
  whole rows in order on one device."""
  q, k, v = _inputs()
  mask = _mask(kind)
  q_bal, balanced_mask = _balanced_inputs(q, mask, shards)
  if backend == 'splash':
    assert attention.splash.takes(balanced_mask, T, T, shards)

    def context(q, k, v, mask):
      return attention.splash.attention(q, k, v, mask, interpret=True)
  else:
    def context(q, k, v, mask):
      return split_rows.attention(q, k, v, mask, implementation='xla')
  got = _split(q_bal, k, v, balanced_mask, shards, context)
  _assert_equal(_in_row_order_of(got, shards), _reference(q, k, v, mask))


def test_xlas_attention_over_balanced_rows_equals_whole_rows():
  """The plain path (CPU's): the causal mask by place in the row."""
  q, k, v = _inputs()
  mask = _mask('packed')
  q_bal, balanced_mask = _balanced_inputs(q, mask, 4)

  def context(q, k, v, mask):
    return attention.fused_context(q, k, v, mask, 'xla')
  got = _split(q_bal, k, v, balanced_mask, 4, context)
  _assert_equal(_in_row_order_of(got, 4), _reference(q, k, v, mask))


def test_balancing_is_chosen_only_for_splash_over_split_rows():
  config = ModelConfig(vocab_size=64, d_model=32, num_heads=2, d_ff=64,
                       num_decoder_layers=1, attention_implementation='splash')
  mesh = jax.make_mesh((1, 2, 2, 1), sharding.MESH_AXES,
                       devices=jax.devices()[:4],
                       axis_types=(jax.sharding.AxisType.Auto,) * 4)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    assert attention.balanced_shards(config, 512) == 2
    assert attention.balanced_shards(config, 256) == 1  # chunks < 128
    xla = config.replace(attention_implementation='xla')
    assert attention.balanced_shards(xla, 512) == 1
  assert attention.balanced_shards(config, 512) == 1  # no mesh


def _lm_batch():
  """Two rows of 512 tokens: one packed with segments across the chunks'
  boundaries and padding at its end, one a single sequence."""
  rs = np.random.RandomState(2)
  ids = rs.randint(3, 64, (2, T + 1)).astype(np.int32)
  seg = np.ones((2, T), np.int32)
  seg[0, 100:333], seg[0, 333:470], seg[0, 470:] = 2, 3, 0
  pos = np.zeros((2, T), np.int32)
  for b in range(2):
    for s in range(1, 4):
      where = np.flatnonzero(seg[b] == s)
      pos[b, where] = np.arange(where.size)
  return {'inputs': ids[:, :-1], 'targets': ids[:, 1:], 'segment_ids': seg,
          'positions': pos}


def _lm_loss_and_grads(implementation: str, shards: int):
  """Loss per token and its gradients of a one-layer rotary LM, on one
  device, or with rows split ``shards`` ways over 'sequence'."""
  config = ModelConfig(vocab_size=64, d_model=64, num_heads=2,
                       num_kv_heads=1, d_ff=64, num_decoder_layers=1,
                       dropout_rate=0.0, attention_dropout_rate=0.0,
                       positional='rotary', max_len=T,
                       attention_implementation=implementation)
  graphdef, params = nnx.split(DecoderLM(config, nnx.Rngs(0)))

  def loss(params, batch):
    sums = steps.loss_sums(nnx.merge(graphdef, params), batch, True)
    return sums['loss'] / sums['tokens']
  batch = _lm_batch()
  if shards == 1:
    return jax.jit(jax.value_and_grad(loss))(params, batch)
  mesh = jax.make_mesh((1, 1, shards, 1), sharding.MESH_AXES,
                       devices=jax.devices()[:shards],
                       axis_types=(jax.sharding.AxisType.Auto,) * 4)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), \
      jax.set_mesh(mesh):
    assert attention.balanced_shards(config, T) == shards
    batch = jax.device_put(batch, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(None, 'sequence')))
    return jax.jit(jax.value_and_grad(loss))(params, batch)


def test_a_training_loss_over_balanced_rows_equals_one_devices():
  """The step reorders the batch (splash over split rows: interpreted
  here) and gets the loss and gradients of rows in order on one device."""
  got = _lm_loss_and_grads('splash', 2)
  want = _lm_loss_and_grads('xla', 1)
  np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
  for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4,
                               atol=1e-6)
