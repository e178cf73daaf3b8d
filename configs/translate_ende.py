"""English -> German translation on the offline Ding sentence pairs.

The paper's architecture (post-norm, ReLU, sinusoidal positions, tied
embeddings over a joint SentencePiece vocabulary, label smoothing 0.1 and
the inverse-square-root schedule), scaled down to ~20k sentence pairs.
Presets: (none) a few-hour CPU run; cpu30: about 30 minutes on 2 CPU
cores (pre-norm, packed rows, a 2000-piece vocabulary; measured in the
docs/training.md); tiny: a seconds-long smoke run.
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import (
  base_config,
  paper_model,
  paper_translation,
)


def get_config(preset: str | None = None) -> ConfigDict:
  c = paper_translation(base_config(), warmup_steps=1000)
  c.model = paper_model(
      d_model=256, num_heads=4, num_encoder_layers=3, num_decoder_layers=3,
      d_ff=1024, dropout_rate=0.1, attention_dropout_rate=0.1, max_len=128)
  c.data.name = 'ding_en_de'
  c.data.direction = 'en-de'
  c.data.src_len = 48
  c.seq_len = 48
  c.batch_size = 64
  c.eval_batch_size = 64
  c.num_steps = 6000
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 1000
  c.sample.prompt = 'The weather is nice today.'
  c.sample.max_new_tokens = 40
  if preset == 'tiny':
    c.model = paper_model(d_model=32, num_heads=2, num_encoder_layers=1,
                          num_decoder_layers=1, d_ff=64,
                          attention_dropout_rate=0.0, max_len=64)
    c.data.vocab_size = 1000
    c.seq_len = c.data.src_len = 24
    c.batch_size = c.eval_batch_size = 8
    c.num_steps = 4
    c.eval_steps = 4
    c.eval_bleu_examples = 8
    c.log_every = c.eval_every = c.checkpoint_every = 2
    c.optim.warmup_steps = 2
    c.sample.max_new_tokens = 8
  elif preset == 'cpu30':
    cpu30(c)
  elif preset:
    raise ValueError(f'Unknown preset {preset!r}; choose tiny, cpu30 or none.')
  return c


def cpu30(c: ConfigDict) -> None:
  """About 30 minutes on 2 CPU cores (docs/training.md: "Translation in a CPU budget").

  Chosen on train[-500:] held out of training: pre-norm trains stably at a
  higher rate than the paper's post-norm; packing removes the ~2/3 of each
  step that unpacked rows spend on padding; small batches give more updates
  in the budget; the holdout runs underfit, so no dropout.
  """
  c.model = paper_model(
      d_model=256, num_heads=4, num_encoder_layers=3, num_decoder_layers=3,
      d_ff=1024, dropout_rate=0.0, attention_dropout_rate=0.0,
      norm_first=True, max_len=128)
  c.data.pack = True
  c.data.vocab_size = 2000
  c.seq_len = c.data.src_len = 64
  c.batch_size = 16
  c.eval_batch_size = 64
  c.num_steps = 1800
  c.optim.update(schedule='warmup_cosine', learning_rate=1.5e-3,
                 warmup_steps=200, final_lr_fraction=0.0, clip_norm=1.0)
  c.eval_every = 600
  c.checkpoint_every = 200
  c.keep_checkpoints = 5
  c.log_every = 50
