"""A GPT-2-small-shaped LM (124M parameters at GPT-2's vocabulary).

12 layers, 12 heads, d_model 768, learned positions, pre-norm, GELU (tanh),
tied head; AdamW (0.9, 0.95), lr 6e-4 with warmup and cosine decay, weight
decay 0.1 off norms and biases, clipping at 1.0, bfloat16 compute.
Dropout 0.1 on embeddings, residuals and the MLP, none on attention
weights (as current LM recipes): attention dropout would force the
explicit [B, N, T, S] softmax instead of a fused kernel
(``--config.model.attention_dropout_rate=0.1`` brings it back).
Default data: lm1b with a 32k SentencePiece vocabulary, packed 1024-token
rows (needs network access to build lm1b). Preset shakespeare: the same
model on the offline plays, byte-level.
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import gpt2_recipe


def get_config(preset: str | None = None) -> ConfigDict:
  return gpt2_recipe(preset)
