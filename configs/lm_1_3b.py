"""A ~1.3B decoder LM (GPT-3 XL's shape) set up for accelerators.

24 layers, 16 heads of 128, d_model 2048, d_ff 8192; the recipe and options
of ``configs/lm_350m.py``. 1.28B parameters at a 32768 vocabulary (1.31B
at GPT-2's 50257). For a device short of memory,
``--config.model.param_dtype=bfloat16`` halves parameters and optimizer
state (Adam's moments follow the parameters' dtype), at the cost of
bfloat16 weight updates.
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import gpt2_recipe, scale_up


def get_config(preset: str | None = None) -> ConfigDict:
  return scale_up(gpt2_recipe(preset), d_model=2048, num_heads=16,
                  num_decoder_layers=24, d_ff=8192)
