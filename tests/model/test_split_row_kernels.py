"""The fused attention kernels over a row split across the 'sequence'
axis: splash (interpreted here) with its block tables cut along the
queries, and the per-shard path cuDNN takes (run here with XLA's
attention in cuDNN's place), equal to attention over whole rows on one
device, forward and backward, causal, padded and packed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.model import attention, sharding, split_rows
from jax_transformer.model.masks import Mask

B, T, N, K, H = 2, 512, 4, 2, 32


def _inputs():
  rs = np.random.RandomState(0)
  q = rs.randn(B, T, N, H).astype(np.float32)
  k, v = (rs.randn(B, T, K, H).astype(np.float32) for _ in range(2))
  return q, k, v


def _mask(kind: str) -> Mask:
  if kind == 'padded':
    return Mask(causal=True, key_lengths=jnp.array([T, T - 200]))
  if kind == 'packed':
    seg = np.ones((B, T), np.int32)
    seg[0, 150:400] = 2          # segments across the shards' boundaries
    seg[0, 400:] = 0             # padding at the end
    seg[1, 300:] = 2
    seg = jnp.asarray(seg)
    return Mask(causal=True, query_segments=seg, key_segments=seg)
  return Mask(causal=kind == 'causal')


def _loss(ctx, mask):
  """A sum over the real queries' outputs (a padding query's output is
  ignored downstream, and the backends leave different ones)."""
  real = (1.0 if mask.query_segments is None
          else (mask.query_segments > 0)[:, :, None, None])
  return jnp.sum(real * ctx ** 2)


def _reference(q, k, v, mask):
  """Whole rows on one device, XLA's attention, and its gradient."""
  def f(q, k, v):
    return _loss(attention.fused_context(q, k, v, mask, 'xla'), mask)
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, v)


def _split(q, k, v, mask, shards, context):
  """The same over a mesh whose 'sequence' axis splits rows shards ways."""
  mesh = jax.make_mesh((1, 2, shards, 1), sharding.MESH_AXES,
                       devices=jax.devices()[:2 * shards],
                       axis_types=(jax.sharding.AxisType.Auto,) * 4)
  put = NamedSharding(mesh, PartitionSpec(('data', 'fsdp'), 'sequence'))

  def f(q, k, v):
    q = sharding.constrain(q, ('batch', 'length', 'heads', 'head_dim'))
    return _loss(context(q, k, v, mask), mask)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), \
      jax.set_mesh(mesh):
    args = jax.device_put((q, k, v), put)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(*args)


def _assert_equal(got, want):
  np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
  for g, w in zip(got[1], want[1]):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4,
                               atol=1e-5)


def test_splash_leaves_split_rows_of_a_full_mask_to_xla():
  assert attention.splash.takes(_mask('full'), T, T, shards=1)
  assert not attention.splash.takes(_mask('full'), T, T, shards=2)


@pytest.mark.parametrize('kind', ['causal', 'padded', 'packed'])
def test_splash_per_shard_equals_whole_rows(kind):
  q, k, v = _inputs()
  mask = _mask(kind)
  assert attention.splash.takes(mask, T, T, shards=2)

  def context(q, k, v, mask):
    return attention.splash.attention(q, k, v, mask, interpret=True)
  _assert_equal(_split(q, k, v, mask, 2, context), _reference(q, k, v, mask))


@pytest.mark.parametrize('kind', ['causal', 'padded', 'packed'])
def test_the_cudnn_per_shard_masks_equal_whole_rows(kind):
  q, k, v = _inputs()
  mask = _mask(kind)

  def context(q, k, v, mask):
    return split_rows.attention(q, k, v, mask, implementation='xla')
  _assert_equal(_split(q, k, v, mask, 4, context), _reference(q, k, v, mask))
