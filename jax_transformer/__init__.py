"""jax_transformer: the Transformer of "Attention Is All You Need" in JAX/Flax NNX."""

from jax_transformer.attention import KVCache
from jax_transformer.config import (PRESETS, ModelConfig, gpt2_small,
                                    transformer_base, transformer_big)
from jax_transformer.models import DecoderLM, EncoderDecoder, count_params
from jax_transformer.decoding import (BeamResult, Generation, beam_search,
                                      generate)
from jax_transformer.sampling import Sampler, greedy

__all__ = [
    'DecoderLM', 'EncoderDecoder', 'KVCache', 'ModelConfig', 'PRESETS',
    'count_params', 'gpt2_small', 'transformer_base', 'transformer_big',
    'BeamResult', 'Generation', 'Sampler', 'beam_search', 'generate',
    'greedy',
]
