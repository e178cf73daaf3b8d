"""KV-cached decoding under one ``jax.jit``: sampling and beam search.

Both entry points work for either model type:

* ``DecoderLM``: ``prompt_ids`` [B, T] are continued.
* ``EncoderDecoder``: ``src_ids`` [B, S] go through the encoder once, the
  cross-attention keys/values are projected once into the cache, and the
  decoder starts from ``prompt_ids`` (a target prefix) or from BOS.

Prompts of different lengths share a batch: pad them (right padding is the
usual choice) and mark real tokens in ``prompt_mask`` (by default
``prompt_ids != pad_id``). The whole prompt is prefilled by one
``model.extend`` call; new tokens then come one per step inside a
``jax.lax.while_loop`` that stops early once every sequence has finished.
Each call is one jitted computation, cached by (model structure, shapes,
sampler, options): calling again with the same shapes does not recompile.

Under a mesh (``jax.set_mesh(mesh)`` or ``mesh=``) with a ``'data'`` axis,
the batch (and the cache, beams included) is sharded over ``'data'``;
parameters keep the sharding they were given.

Reserved ids follow the tokenizers: PAD 0, BOS 1, EOS 2.

The package, by file: ``inputs`` (checks and placement), ``prefill`` (the
prompt's pass), ``loop`` (the sampling loop), ``beam`` (beam search),
``api`` (the public entry points), ``results`` (what they return).
"""

from jax_transformer.decoding import beam, loop  # noqa: F401
from jax_transformer.decoding.api import beam_search, generate  # noqa: F401
from jax_transformer.decoding.beam import length_penalty  # noqa: F401
from jax_transformer.decoding.results import (  # noqa: F401
    EXTRA_NEW_TOKENS,
    BeamResult,
    Generation,
    row_tokens,
)
from jax_transformer.decoding.sampling import Sampler, greedy  # noqa: F401
from jax_transformer.reserved_ids import BOS_ID, EOS_ID, PAD_ID  # noqa: F401
