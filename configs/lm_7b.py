"""A ~6.7B decoder LM (GPT-3 6.7B's shape) set up for TPU pods and GPU
clusters.

32 layers, 32 heads of 128, d_model 4096, d_ff 16384, 2048-token rows; the
recipe and options of ``configs/lm_1_3b.py`` (scanned layers, remat of all
but matmul outputs, a chunked loss, FSDP over every device), 512 rows a
step (about 1M tokens). 6.5B parameters at a 32768 vocabulary. Check that
it fits a target before booking it:
``python train.py --config lm_7b --aot_target v5p-128``.
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import gpt2_recipe, scale_up


def get_config(preset: str | None = None) -> ConfigDict:
  c = scale_up(gpt2_recipe(preset), d_model=4096, num_heads=32,
               num_decoder_layers=32, d_ff=16384, max_len=2048)
  c.seq_len = 2048
  c.batch_size = c.eval_batch_size = 512
  return c
