"""Packing is invisible to the models: each segment of a packed row gets the
logits that its sequence gets alone.

The packed batches come from the data pipeline's packer, so this checks the
batch format (segment ids, restarting positions) against the models' masks.
"""

import jax
import numpy as np
import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.data import batching

V = 50


def tiny_config(positional):
  return jt.ModelConfig(vocab_size=V, d_model=32, num_heads=4,
                        num_encoder_layers=2, num_decoder_layers=2, d_ff=64,
                        dropout_rate=0.0, attention_dropout_rate=0.0,
                        positional=positional, max_len=64, norm_first=True)


def jitted(model):
  """The model's forward as one compiled function (much faster than eager)."""
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, *args, **kwargs):
    return nnx.merge(graphdef, state)(*args, **kwargs)

  return lambda *args, **kwargs: np.asarray(forward(state, *args, **kwargs))


def sequences(n, lengths, seed):
  # Few distinct lengths: each new shape costs op compilations when alone.
  rng = np.random.default_rng(seed)
  return [rng.integers(4, V, size=rng.choice(lengths)) for _ in range(n)]


@pytest.mark.parametrize('positional', ['learned', 'rotary', 'sinusoidal'])
def test_decoder_lm_packed_equals_alone(positional):
  model = jitted(jt.DecoderLM(tiny_config(positional)))
  seqs = sequences(7, (3, 6), seed=0)
  layout = batching.lm_layout(24)
  batch = next(batching.batch_examples(
      [batching.lm_example(s) for s in seqs], layout, 2, pack=True))
  assert batch['segment_ids'].max() >= 3  # really packed
  logits = model(batch['inputs'], segment_ids=batch['segment_ids'],
                 positions=batch['positions'])
  checked = 0
  for r in range(2):
    for s in range(1, batch['segment_ids'][r].max() + 1):
      where = batch['segment_ids'][r] == s
      ids = batch['inputs'][r][where][None]
      alone = model(ids)[0]
      np.testing.assert_allclose(logits[r][where], alone, atol=1e-5)
      checked += 1
  assert checked == len(seqs)


def test_encoder_decoder_packed_equals_alone():
  model = jitted(jt.EncoderDecoder(tiny_config('sinusoidal')))
  srcs, tgts = sequences(5, (4, 7), seed=1), sequences(5, (3, 5), seed=2)
  layout = batching.translation_layout(20, 20)
  examples = [batching.translation_example(s, t) for s, t in zip(srcs, tgts)]
  b = next(batching.batch_examples(examples, layout, 2, pack=True))
  assert b['tgt_segment_ids'].max() >= 2
  logits = model(
      b['src'], b['tgt_in'], src_segment_ids=b['src_segment_ids'],
      tgt_segment_ids=b['tgt_segment_ids'], src_positions=b['src_positions'],
      tgt_positions=b['tgt_positions'])
  checked = 0
  for r in range(2):
    for s in range(1, b['tgt_segment_ids'][r].max() + 1):
      src = b['src'][r][b['src_segment_ids'][r] == s][None]
      where = b['tgt_segment_ids'][r] == s
      alone = model(src, b['tgt_in'][r][where][None])[0]
      np.testing.assert_allclose(logits[r][where], alone, atol=1e-5)
      checked += 1
  assert checked == len(srcs)
