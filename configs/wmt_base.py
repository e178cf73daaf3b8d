"""The paper's base model on WMT14 English -> German, with its settings.

d_model 512, 8 heads, 6 + 6 layers, d_ff 2048, dropout 0.1, a shared 37000
SentencePiece (BPE) vocabulary with tied embeddings; Adam (0.9, 0.98, 1e-9)
with lr = d_model^-0.5 * min(step^-0.5, step * 4000^-1.5), label smoothing
0.1, 100k steps of ~25k target tokens (128 packed rows of 256 tokens;
scale batch_size with your devices). Needs network access to build WMT14.
Preset big: the paper's big model (300k steps, dropout 0.3).
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import (
  base_config,
  paper_model,
  paper_translation,
)


def get_config(preset: str | None = None) -> ConfigDict:
  c = paper_translation(base_config(), warmup_steps=4000)
  c.model = paper_model(
      d_model=512, num_heads=8, num_encoder_layers=6, num_decoder_layers=6,
      d_ff=2048, dropout_rate=0.1, attention_dropout_rate=0.1, max_len=512,
      dtype='bfloat16')
  c.vocab_multiple = 8  # 37000 stays 37000: the paper's 63,084,544.
  c.data.name = 'wmt14_translate/de-en'
  c.data.direction = 'en-de'
  c.data.tokenizer = 'sentencepiece'
  c.data.vocab_size = 37000
  c.data.spm_model_type = 'bpe'
  c.data.pack = True
  c.data.src_len = 256
  c.data.eval_split = 'validation'
  c.seq_len = 256
  c.batch_size = 128
  c.eval_batch_size = 128
  c.num_steps = 100_000
  c.log_every = 100
  c.eval_every = 5000
  c.checkpoint_every = 2000
  # The paper averages the last 5 checkpoints (evaluate.py --average_last 5).
  c.keep_checkpoints = 5
  c.sample.prompt = 'The cat sat on the mat.'
  c.sample.max_new_tokens = 64
  if preset == 'big':
    c.model.update(d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3,
                   attention_dropout_rate=0.3)
    c.num_steps = 300_000
  elif preset:
    raise ValueError(f'Unknown preset {preset!r}; choose big or none.')
  return c
