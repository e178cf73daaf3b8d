"""A ~70B decoder LM (80 layers, d_model 8192, grouped-query attention)
for TPU pods: the stretch shape of docs/scaling.md.

80 layers, 64 query heads of 128 sharing 8 key/value heads, d_ff 28672
with SwiGLU, RMSNorm, 2048-token rows, 512 rows a step (about 1M tokens);
otherwise the recipe of ``configs/lm_7b.py`` (scanned layers, remat of all
but matmul outputs, a chunked loss, FSDP over every device). 69B
parameters at a 32768 vocabulary. Check it before booking a pod:
``python train.py --config lm_70b --aot_target v5p-1024``.
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import gpt2_recipe, scale_up


def get_config(preset: str | None = None) -> ConfigDict:
  c = scale_up(gpt2_recipe(preset), d_model=8192, num_heads=64,
               num_kv_heads=8, num_decoder_layers=80, d_ff=28672,
               activation='swiglu', norm='rmsnorm', max_len=2048)
  c.seq_len = 2048
  c.batch_size = c.eval_batch_size = 512
  return c
