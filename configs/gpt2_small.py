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

from configs.common import base_config, model_fields


def get_config(preset: str | None = None) -> ConfigDict:
  c = base_config()
  c.model = model_fields(
      d_model=768, num_heads=12, num_decoder_layers=12, d_ff=3072,
      dropout_rate=0.1, attention_dropout_rate=0.0, activation='gelu_tanh',
      norm_first=True, positional='learned', max_len=1024,
      scale_embeddings=False, use_bias=True, dtype='bfloat16')
  c.vocab_multiple = 128
  c.data.name = 'lm1b'
  c.data.tokenizer = 'sentencepiece'
  c.data.vocab_size = 32768
  c.data.pack = True
  c.data.eval_split = 'test'
  c.seq_len = 1024
  c.batch_size = 64
  c.eval_batch_size = 64
  c.num_steps = 100_000
  c.log_every = 100
  c.eval_every = 5000
  c.checkpoint_every = 2000
  c.optim.update(optimizer='adamw', schedule='warmup_cosine',
                 learning_rate=6e-4, warmup_steps=2000, b1=0.9, b2=0.95,
                 eps=1e-8, weight_decay=0.1, clip_norm=1.0)
  c.sample.prompt = 'The'
  if preset == 'shakespeare':
    c.data.update(name='shakespeare', tokenizer=None, vocab_size=None,
                  pack=False, eval_split='validation')
    c.seq_len = 256
    c.batch_size = c.eval_batch_size = 16
    c.num_steps = 5000
    c.sample.prompt = 'ROMEO:'
  elif preset:
    raise ValueError(f'Unknown preset {preset!r}; choose shakespeare or '
                     'none.')
  return c
