"""The projections' contraction (``low_rank.contract``): the same product
as the einsum it stands for, and the attention's output projection read as
stored in a compiled decoding step (no copy of its weight per call)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer.model.config import gpt2_small
from jax_transformer.model.low_rank import contract
from jax_transformer.model.models import DecoderLM


@pytest.mark.parametrize('spec, x_shape, w_shape', [
    ('BTNH,NHD->BTD', (2, 3, 4, 8), (4, 8, 16)),   # two axes merged
    ('BTNH,NHr->BTr', (2, 3, 4, 8), (4, 8, 2)),    # a LoRA adapter's A
    ('BTD,DNH->BTNH', (2, 3, 16), (16, 4, 8)),     # one axis: the einsum
])
def test_contract_equals_einsum(spec, x_shape, w_shape):
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, x_shape)
  w = jax.random.normal(kw, w_shape)
  np.testing.assert_allclose(contract(spec, x, w), jnp.einsum(spec, x, w),
                             rtol=1e-5, atol=1e-5)


def test_decoding_step_reads_the_output_weight_as_stored():
  config = gpt2_small(vocab_size=64, d_model=128, num_heads=4,
                      num_decoder_layers=2, d_ff=256, max_len=32)
  model = DecoderLM(config, nnx.Rngs(0))
  graphdef, state = nnx.split(model)

  def step(state, cache, tokens):
    logits, cache = nnx.merge(graphdef, state).extend(
        tokens[:, None], cache, jnp.ones((1, 1), bool))
    return logits, cache

  cache = jax.tree.map(jnp.array, model.init_cache(1, 32))
  hlo = jax.jit(step, donate_argnums=1).lower(
      state, cache, jnp.zeros(1, jnp.int32)).compile().as_text()
  n, h, d = config.num_heads, config.head_dim, config.d_model
  # Any copy or transpose of the out kernel's N*H*D floats (as [H, N, D],
  # the layout a two-axis contraction asked for).
  moved = [line for line in hlo.splitlines()
           if re.search(r'= f32\[[\d,]+\]\S* (copy|transpose)\(', line)
           and 'out' in line
           and np.prod([int(v) for v in re.search(
               r'= f32\[([\d,]+)\]', line).group(1).split(',')]) == n * h * d]
  assert not moved, moved[:2]
