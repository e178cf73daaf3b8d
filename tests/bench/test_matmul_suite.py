"""benchmark.py --suite matmul: the paper-base forward's dots, each shape
counted as often as the forward runs it, both sides the same products."""

from flax import nnx
from flop_count import matmul_weights

from jax_transformer.bench import matmul
from jax_transformer.model.config import transformer_base
from jax_transformer.model.models import EncoderDecoder


def test_the_shapes_are_the_forwards_dots():
  """Their FLOPs, counted as often as the forward runs each, are the
  forward's counted from the model's weights: 2 a multiply-add for each
  weight and token (both sides have 512 tokens), and every attention's
  two products over all 64 keys (XLA computes the causal half too)."""
  config = transformer_base()
  model = nnx.eval_shape(lambda: EncoderDecoder(config, nnx.Rngs(0)))
  tokens = matmul.ROWS * matmul.LENGTH
  attentions = config.num_encoder_layers + 2 * config.num_decoder_layers
  want = (2 * sum(matmul_weights(model).values()) * tokens
          + attentions * 2 * 2 * config.d_model * matmul.LENGTH * tokens)
  dots = sum(count * matmul._flop(left, right)
             for _, left, right, count in matmul.shapes())
  assert dots == want


def test_one_round_gives_a_row_per_shape_and_their_weighted_sum(monkeypatch):
  shapes = [('plain', (8, 16), (16, 32), 3),
            ('batched', (4, 8, 16), (4, 16, 8), 2)]
  monkeypatch.setattr(matmul, 'shapes', lambda: shapes)
  rows = matmul.run(rounds=1)
  assert [r['what'] for r in rows[:-1]] == [s[0] for s in shapes]
  total = rows[-1]
  assert total['shape'] == 'forward_dots'
  for side in ('jax', 'torch'):
    summed = sum(r['count'] * r[f'{side}_s'] for r in rows[:-1])
    assert abs(total[f'{side}_s'] - summed) <= 1e-9 * summed
