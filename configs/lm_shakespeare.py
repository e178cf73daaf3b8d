"""The default job: a small decoder-only LM on the offline Shakespeare plays.

Byte-level tokens, pre-norm, rotary positions, GELU. Presets:
  (none)  learns visibly on 2 CPU cores in a few minutes
  tiny    a seconds-long smoke run (tests)
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import base_config, model_fields, small_lm


def get_config(preset: str | None = None) -> ConfigDict:
  c = base_config()
  if preset == 'tiny':
    c.model = model_fields(small_lm, d_model=32, num_heads=2,
                           num_decoder_layers=1,
                           d_ff=64, max_len=64)
    c.seq_len = 32
    c.batch_size = c.eval_batch_size = 8
    c.num_steps = 6
    c.eval_steps = 4
    c.log_every = c.eval_every = c.checkpoint_every = 3
    c.sample.max_new_tokens = 16
  elif preset:
    raise ValueError(f'Unknown preset {preset!r}; choose tiny or none.')
  return c
