"""chunked_cross_entropy against cross_entropy of the full logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_transformer.compile import hlo_stats
from jax_transformer.model import layers
from jax_transformer.model.config import ModelConfig
from jax_transformer.train import losses

B, T, D, V = 2, 6, 8, 64


def example(batch=B, length=T, width=D, vocab=V, seed=0):
  """hidden [B, T, D], kernel [D, V], targets [B, T], weights [B, T]."""
  keys = jax.random.split(jax.random.key(seed), 4)
  hidden = jax.random.normal(keys[0], (batch, length, width))
  kernel = jax.random.normal(keys[1], (width, vocab)) * width ** -0.5
  targets = jax.random.randint(keys[2], (batch, length), 0, vocab)
  # Uneven weights catch a loss that ignores them.
  weights = jax.random.uniform(keys[3], (batch, length), minval=0.5)
  return hidden, kernel, targets, weights


def full_sums(hidden, kernel, targets, weights, label_smoothing=0.0,
              z_loss=0.0, compute_dtype=jnp.float32):
  """The reference: cross_entropy of the model head's einsum."""
  logits = jnp.einsum('BTD,DV->BTV', hidden.astype(compute_dtype),
                      kernel.astype(compute_dtype),
                      preferred_element_type=jnp.float32)
  return losses.cross_entropy(logits, targets, weights, label_smoothing,
                              z_loss)


def objective(sums_fn, loss_scale=1.0, nll_scale=0.0, **kw):
  """A scalar of (hidden, kernel, targets, weights), for jax.grad."""

  def f(hidden, kernel, targets, weights):
    sums = sums_fn(hidden, kernel, targets, weights, **kw)
    return loss_scale * sums['loss'] + nll_scale * sums['nll'], sums

  return f


def value_and_grads(f, args):
  """(f's sums, d/d hidden, d/d kernel)."""
  (_, sums), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
      *args)
  return sums, grads


def assert_close(got, want, rtol):
  """Max error relative to the largest magnitude, so near-zero entries of a
  gradient do not demand an impossible elementwise precision."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape
  scale = max(np.abs(want).max(), 1e-30)
  assert np.abs(got - want).max() <= rtol * scale


def check_matches(args, rtol, compute_dtype=jnp.float32, grad_rtol=None,
                  loss_scale=1.0, nll_scale=0.0, **kw):
  """chunked_cross_entropy's sums and gradients equal the reference's."""
  chunked = objective(losses.chunked_cross_entropy, loss_scale, nll_scale,
                      compute_dtype=compute_dtype, **kw)
  chunk_kw = {k: v for k, v in kw.items() if k != 'chunk_size'}
  full = objective(full_sums, loss_scale, nll_scale,
                   compute_dtype=compute_dtype, **chunk_kw)
  got_sums, got_grads = value_and_grads(chunked, args)
  want_sums, want_grads = value_and_grads(full, args)
  for key in ('loss', 'nll', 'tokens'):
    assert_close(got_sums[key], want_sums[key], rtol)
  for got, want, arg in zip(got_grads, want_grads, args):
    assert got.dtype == arg.dtype
    assert_close(got, want, grad_rtol or rtol)
  return got_grads


SETTINGS = [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-4), (0.1, 1e-4)]


@pytest.mark.parametrize('label_smoothing,z_loss', SETTINGS)
# 5 does not divide B * T = 12 (padded); 4 does; 12 is one chunk.
@pytest.mark.parametrize('chunk_size', [5, 4, 12])
def test_equals_cross_entropy_of_full_logits(label_smoothing, z_loss,
                                             chunk_size):
  check_matches(example(), 1e-6, label_smoothing=label_smoothing,
                z_loss=z_loss, chunk_size=chunk_size)


def test_closed_form_terms_are_visible():
  # Each setting must change the loss, or the tests above prove too little.
  args = example()
  values = [float(losses.chunked_cross_entropy(
      *args, label_smoothing=ls, z_loss=z * 100)['loss'])
            for ls, z in SETTINGS]
  assert len(set(values)) == len(SETTINGS)


def test_gradient_of_loss_and_nll_together():
  # A nonzero cotangent on both outputs exercises both terms of d logits.
  check_matches(example(seed=1), 1e-6, loss_scale=0.7, nll_scale=1.3,
                label_smoothing=0.1, z_loss=1e-2, chunk_size=5)


def test_padding_weights_give_zero_gradient_on_padding():
  hidden, kernel, targets, weights = example(seed=2)
  weights = weights.at[:, 4:].set(0.0).at[1, 2:].set(0.0)
  d_hidden, _ = check_matches((hidden, kernel, targets, weights), 1e-6,
                              label_smoothing=0.1, z_loss=1e-4, chunk_size=5)
  padded = np.asarray(weights) == 0
  assert np.all(np.asarray(d_hidden)[padded] == 0)
  assert np.all(np.abs(np.asarray(d_hidden)[~padded]).max(-1) > 0)


def test_bfloat16_compute_matches_unchunked_bfloat16():
  # The reference rounds its gradients to bf16 (the transpose of the cast);
  # the chunked backward accumulates in float32: a bf16-sized tolerance.
  check_matches(example(seed=3), 1e-5, compute_dtype=jnp.bfloat16,
                grad_rtol=1e-2, label_smoothing=0.1, z_loss=1e-4,
                chunk_size=5)


def test_bfloat16_inputs_get_bfloat16_gradients():
  hidden, kernel, targets, weights = example(seed=4)
  args = (hidden.astype(jnp.bfloat16), kernel, targets, weights)
  check_matches(args, 1e-5, compute_dtype=jnp.bfloat16, grad_rtol=1e-2,
                chunk_size=5)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_tied_head_passes_the_table_transposed(dtype):
  config = ModelConfig(vocab_size=V, d_model=D, num_heads=2, d_ff=16,
                       dtype=dtype)
  embed = layers.Embed(config, nnx.Rngs(0))
  hidden, _, targets, weights = example(seed=5)
  want = losses.cross_entropy(embed.attend(hidden), targets, weights, 0.1)
  got = losses.chunked_cross_entropy(
      hidden, embed.embedding[...].T, targets, weights, 0.1, chunk_size=5,
      compute_dtype=config.compute_dtype)
  for key in want:
    assert_close(got[key], want[key], 1e-6)


def test_weights_get_their_gradient():
  # The weighting is outside the custom VJP, so plain autodiff covers it.
  args = example(seed=6)

  def grad_weights(sums_fn):
    return jax.grad(lambda w: sums_fn(*args[:3], w, 0.1, 1e-4)['loss'])(
        args[3])

  assert_close(grad_weights(losses.chunked_cross_entropy),
               grad_weights(full_sums), 1e-6)


def test_jit_and_bad_chunk_size():
  args = example()
  eager = losses.chunked_cross_entropy(*args, chunk_size=5)
  jitted = jax.jit(lambda *a: losses.chunked_cross_entropy(*a,
                                                           chunk_size=5))(
                                                               *args)
  assert_close(jitted['loss'], eager['loss'], 1e-6)
  with pytest.raises(ValueError, match='chunk_size must be positive'):
    losses.chunked_cross_entropy(*args, chunk_size=0)


# Memory: one [chunk, V] block at a time, in the forward and the backward.

MB, MT, MD, MV, CHUNK = 2, 64, 16, 512, 32


def memory_args():
  return example(batch=MB, length=MT, width=MD, vocab=MV)


def grad_fn(sums_fn, **kw):
  return jax.grad(lambda *a: sums_fn(*a, 0.1, 1e-4, **kw)['loss'],
                  argnums=(0, 1))


def float32_sizes(jaxpr):
  """Element counts of every float32 value in a jaxpr and its sub-jaxprs."""
  def of(values):
    return [int(np.prod(v.aval.shape)) for v in values
            if getattr(v.aval, 'dtype', None) == jnp.float32]

  sizes = of(jaxpr.invars)
  for eqn in jaxpr.eqns:
    sizes += of(eqn.outvars)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else [param]:
        sub = getattr(sub, 'jaxpr', sub)
        if hasattr(sub, 'eqns'):
          sizes += float32_sizes(sub)
  return sizes


@pytest.mark.parametrize('chunked', [True, False])
def test_no_float32_array_of_all_logits(chunked):
  if chunked:
    f = grad_fn(losses.chunked_cross_entropy, chunk_size=CHUNK)
  else:
    f = grad_fn(full_sums)
  largest = max(float32_sizes(jax.make_jaxpr(f)(*memory_args()).jaxpr))
  all_logits = MB * MT * MV
  # The kernel and its gradient [D, V] must stay below the logits' size.
  assert MD * MV < all_logits
  if chunked:
    assert largest == CHUNK * MV
  else:
    assert largest == all_logits


def test_compiled_gradient_needs_no_logits_sized_buffer():
  args = memory_args()
  logits_bytes = MB * MT * MV * 4

  def temp_bytes(f):
    compiled = jax.jit(f).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  chunked = temp_bytes(grad_fn(losses.chunked_cross_entropy,
                               chunk_size=CHUNK))
  full = temp_bytes(grad_fn(full_sums))
  assert chunked < logits_bytes <= full


# Under a mesh: the head gathered once a step, not once a chunk.

SB, ST, SD, SV = 8, 16, 16, 64


def sharded_mesh():
  """data 1 x fsdp 4 x tensor 2 over the 8 host devices."""
  return jax.make_mesh((1, 4, 2), ('data', 'fsdp', 'tensor'),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)


def sharded(mesh, args):
  """example() laid out as a train step holds them: rows over the batch
  axes, the kernel [D, V] over fsdp x tensor."""
  rows = NamedSharding(mesh, P(('data', 'fsdp')))
  head = NamedSharding(mesh, P('fsdp', 'tensor'))
  hidden, kernel, targets, weights = args
  return (jax.device_put(hidden, rows), jax.device_put(kernel, head),
          jax.device_put(targets, rows), jax.device_put(weights, rows))


def under_mesh(mesh, f):
  """f jitted and traced with mesh in context (as the trainer does)."""
  jitted = jax.jit(f)

  def call(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return jitted(*args)
  call.lower = lambda *args: _lower(mesh, jitted, args)
  return call


def _lower(mesh, jitted, args):
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return jitted.lower(*args)


# (label_smoothing, z_loss), chunk_size, compute_dtype: each pair of
# values of any two of them once (a pairwise cover of the 2 x 2 x 2 grid in
# 4 cases; the closed-form terms, the chunking and the dtype are separate
# parts of the loss). Chunk 32: four chunks of rows split 4 ways; 5: padded
# chunks the batch shards do not divide (their partial sums then stay in
# one slot).
@pytest.mark.parametrize('label_smoothing,z_loss,chunk_size,compute_dtype', [
    (0.0, 0.0, 32, jnp.float32), (0.0, 0.0, 5, jnp.bfloat16),
    (0.1, 1e-4, 32, jnp.bfloat16), (0.1, 1e-4, 5, jnp.float32)])
def test_sharded_chunks_equal_unchunked_and_the_meshless_path(
    label_smoothing, z_loss, chunk_size, compute_dtype):
  """Sums and gradients under a data x fsdp x tensor mesh equal the full
  logits' (unchunked) and the chunked loss traced without a mesh (the
  path before the head was gathered once: no constraints, one partial
  sum)."""
  mesh = sharded_mesh()
  args = example(batch=SB, length=ST, width=SD, vocab=SV, seed=3)
  kw = dict(label_smoothing=label_smoothing, z_loss=z_loss,
            compute_dtype=compute_dtype)
  chunked = objective(losses.chunked_cross_entropy, 1.0, 0.5,
                      chunk_size=chunk_size, **kw)
  got_sums, got_grads = under_mesh(
      mesh, lambda *a: value_and_grads(chunked, a))(*sharded(mesh, args))
  meshless_sums, meshless_grads = jax.jit(
      lambda *a: value_and_grads(chunked, a))(*args)
  full_sums_, full_grads = value_and_grads(
      objective(full_sums, 1.0, 0.5, **kw), args)
  rtol = 1e-6 if compute_dtype == jnp.float32 else 2e-3
  for key in ('loss', 'nll', 'tokens'):
    assert_close(got_sums[key], meshless_sums[key], 1e-6)
    assert_close(got_sums[key], full_sums_[key], rtol)
  for got, meshless, full in zip(got_grads, meshless_grads, full_grads):
    assert_close(got, meshless, 1e-5)
    assert_close(got, full, rtol if compute_dtype == jnp.float32 else 1e-2)


def test_collective_bytes_do_not_grow_with_the_chunks():
  """The kernel is gathered, and its gradient reduced, once: the
  collectives of the loss and its gradient move the same bytes for 2
  chunks as for 16 (before, each chunk gathered the kernel and
  all-reduced its gradient: about 4x the bytes at 16 chunks)."""
  mesh = sharded_mesh()
  args = sharded(mesh, example(batch=SB, length=64, width=64, vocab=1024))

  def moved(chunk_size):
    f = objective(losses.chunked_cross_entropy, chunk_size=chunk_size,
                  compute_dtype=jnp.bfloat16)
    hlo = under_mesh(mesh, lambda *a: value_and_grads(f, a)).lower(
        *args).compile().as_text()
    return hlo_stats.collective_bytes(hlo)

  few, many = moved(SB * 64 // 2), moved(SB * 64 // 16)
  assert many == few
  # The bf16 kernel [D, V / tensor] gathered over fsdp once for the
  # forward and once for the backward's recomputed logits.
  assert few['all-gather'] <= 2 * (64 * 1024 // 2 * 2)
