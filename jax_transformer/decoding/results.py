"""What decoding returns, and the defaults it uses."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

Array = jax.Array

# The default length limit: input length + this many new tokens (the paper's).
EXTRA_NEW_TOKENS = 50


class Generation(NamedTuple):
  """What :func:`generate` returns.

  tokens:  [B, N] int32, the new tokens; pad_id after a sequence's EOS.
  lengths: [B] int32, new tokens per sequence, its EOS included (N when a
           sequence never produced EOS).
  """
  tokens: Array
  lengths: Array


class BeamResult(NamedTuple):
  """What :func:`beam_search` returns (the best hypothesis per sequence).

  tokens:  [B, L] int32, the new tokens, EOS included; pad_id after it.
  scores:  [B] float32, log P(tokens) / ((5 + length) / 6) ** alpha.
  lengths: [B] int32, tokens in each hypothesis, its EOS included.
  """
  tokens: Array
  scores: Array
  lengths: Array


def row_tokens(result: Generation | BeamResult, row: int) -> list[int]:
  """Row ``row``'s new tokens as a list, up to its length (EOS included)."""
  tokens = np.asarray(result.tokens[row])
  return tokens[:int(result.lengths[row])].tolist()
