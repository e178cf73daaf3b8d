"""Continuations until a stop sequence: lm-eval's ``generate_until`` over
the KV-cached decoder.

Rows are sorted by length and decoded ``batch_size`` at a time through
``decoding.generate`` (widths rounded up to a multiple of 8, as
``decoding.inference`` does, so batches share programs; a last, short
batch padded to a power of two of rows). A greedy batch first decodes
:data:`FIRST_PASS` tokens: the rows whose text already holds a stop
sequence (or that ended at EOS) are done, and only the others are decoded
again to ``max_new_tokens``. Greedy decoding is deterministic, so the
second pass repeats the first's tokens; a task that stops at a newline
costs a few dozen steps, not ``max_gen_toks``. Once most rows of a batch
outlive the first pass (a task that rarely stops early), later batches
skip it. A sampled batch decodes ``max_new_tokens`` at once (its draws
depend on the batch).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np

from jax_transformer import decoding
from jax_transformer.decoding.sampling import is_deterministic
from jax_transformer.harness import scoring

FIRST_PASS = 32
ROUND_TO = 8


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
  """(text before the first stop sequence, whether one was found)."""
  ends = [i for i in (text.find(s) for s in stops if s) if i >= 0]
  return (text[:min(ends)], True) if ends else (text, False)


def _width(n: int) -> int:
  return -(-n // ROUND_TO) * ROUND_TO


def _decode_batch(model, rows: Sequence[Sequence[int]], size: int,
                  new_tokens: int, sampler, key, eos_id, mesh
                  ) -> list[tuple[list[int], bool]]:
  """(new tokens without EOS, whether EOS ended the row) per row."""
  width = _width(max(map(len, rows)))
  if model.config.positional == 'learned':
    width = max(min(width, model.config.max_len - new_tokens),
                max(map(len, rows)))
  filled = [*rows, *rows[-1:] * (size - len(rows))]
  ids = np.zeros((size, width), np.int32)
  for i, row in enumerate(filled):
    ids[i, :len(row)] = row
  mask = np.arange(width) < np.array([[len(r)] for r in filled])
  out = scoring.on_host(decoding.generate(
      model, ids, mask, max_new_tokens=new_tokens, sampler=sampler, key=key,
      eos_id=eos_id, mesh=mesh))
  results = []
  for r in range(len(rows)):
    tokens = decoding.row_tokens(out, r)
    ended = bool(tokens) and eos_id is not None and tokens[-1] == eos_id
    results.append((tokens[:-1] if ended else tokens, ended))
  return results


def generate_until(model, rows: Sequence[Sequence[int]],
                   decode: Callable[[list[int]], str], stops: Sequence[str],
                   max_new_tokens: int, *, sampler, key: jax.Array,
                   eos_id: int | None, batch_size: int, mesh=None,
                   progress: Callable[[int], None] | None = None
                   ) -> list[str]:
  """The decoded continuation of each row (ids, laid out and truncated),
  cut before the first of ``stops``; in the given order."""
  order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
  data = 1 if mesh is None else mesh.shape.get('data', 1)
  size = -(-batch_size // data) * data
  # A short first pass while it pays: once most rows of a batch outlive
  # it, the next batches decode to the end at once.
  short = is_deterministic(sampler)
  outputs: list[str] = [''] * len(rows)
  for b, start in enumerate(range(0, len(order), size)):
    batch = order[start:start + size]
    todo = batch
    passes = ([min(FIRST_PASS, max_new_tokens)] if short else []) + [
        max_new_tokens]
    for p, n in enumerate(dict.fromkeys(passes)):  # one when they are equal
      decoded = _decode_batch(model, [rows[i] for i in todo],
                              scoring.rows_for(len(todo), size, data), n,
                              sampler, jax.random.fold_in(key, b), eos_id,
                              mesh)
      left = []
      for i, (tokens, ended) in zip(todo, decoded):
        text, stopped = cut_at_stop(decode(tokens), stops)
        outputs[i] = text
        if not (stopped or ended):
          left.append(i)
      if p == 0 and short and len(passes) > 1:
        short = 2 * len(left) <= len(todo)
      todo = left
      if not todo:
        break
    if progress is not None:
      progress(len(batch))
  return outputs
