"""A decoder LM's FLOPs of one train step, counted from its parameters'
shapes rather than by jax_transformer/train/perf.py's formula: the tests
that check a predicted MFU recompute it from this count.

The convention is perf.py's (the PaLM paper's): 2 FLOPs a multiply-add,
a train step 3 forwards; 6 N a token for N matmul weights, and causal
attention's two matmuls over half the keys on average.
"""

import jax
from flax import nnx

from jax_transformer.model.models import DecoderLM


def matmul_weights(model) -> dict[str, int]:
  """Size of each matmul kernel of model (its layers unscanned) by path:
  every parameter of two or more dimensions but the head-split attention
  biases ([heads, head width]), learned positions and, where the output
  head is a kernel of its own, the embedding (a lookup, no matmul)."""
  leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))
  sizes = {jax.tree_util.keystr(path): leaf.size
           for path, leaf in leaves[0] if len(leaf.shape) >= 2}
  sizes = {path: size for path, size in sizes.items()
           if 'bias' not in path.rsplit('[', 1)[-1]}
  own_head = any(path.startswith("['head']") for path in sizes)
  return {path: size for path, size in sizes.items()
          if 'position' not in path
          and not (own_head and path.startswith("['embed']"))}


def lm_train_flops(config, batch: int, seq_len: int) -> float:
  """FLOPs of a train step of ``batch`` rows of ``seq_len`` tokens of the
  decoder LM ``config`` describes (built abstractly: no weights made)."""
  # The same matmuls unscanned (a scanned stack's biases gain a dimension).
  unscanned = config.replace(scan_layers=False)
  model = nnx.eval_shape(lambda: DecoderLM(unscanned, nnx.Rngs(0)))
  weights = sum(matmul_weights(model).values())
  tokens = batch * seq_len
  # Scores and weighted values: 2 matmuls of width x keys a query, each
  # query of a causal mask seeing seq_len / 2 keys on average.
  width = config.num_heads * config.head_dim
  attention = 2 * 2 * width * seq_len / 2 * tokens * config.num_decoder_layers
  return 3.0 * (2.0 * weights * tokens + attention)
