"""A ~350M decoder LM (GPT-2 medium's shape) set up for accelerators.

24 layers, 16 heads, d_model 1024, d_ff 4096; GPT-2 small's recipe
(``configs/gpt2_small.py``: lm1b, 32k SentencePiece, packed 1024-token
rows, AdamW, bf16 compute) without dropout (as pretraining recipes at this
size run) and with what pays at this size: scanned layers
(compile time independent of depth), remat of everything but matmul
outputs, a chunked loss, and FSDP over all devices. 337M parameters at a
32768 vocabulary (355M at GPT-2's 50257).
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import gpt2_recipe, scale_up


def get_config(preset: str | None = None) -> ConfigDict:
  return scale_up(gpt2_recipe(preset), d_model=1024, num_heads=16,
                  num_decoder_layers=24, d_ff=4096)
