"""Texts in, texts out: many sentences or prompts through the KV-cached decoder.

:func:`decode_texts` is what ``scripts/generate.py`` runs for one ``--input``
or a whole ``--input_file``, and what an evaluation script calls to translate
a test set::

  from jax_transformer.decoding import inference
  outputs = inference.decode_texts(model, tokenizer, sentences, beam_size=4)

Texts are laid out as in training (:func:`layout`), sorted by length so that
a batch holds rows of similar length, right-padded, and decoded batch by
batch; the outputs come back in input order. Widths and new-token counts are
rounded up to multiples of :data:`ROUND_TO` so that batches reuse compiled
programs. Each row keeps its own length limit (by default its length +
``decoding.EXTRA_NEW_TOKENS``), so greedy decoding gives every text the
output it gets when decoded alone.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from jax_transformer import data, decoding, fields
from jax_transformer.data.batching import markers
from jax_transformer.decoding.sampling import greedy, is_deterministic
from jax_transformer.errors import UsageError
from jax_transformer.model.families import family_of

# Batch widths and new-token counts are rounded up to a multiple of this.
ROUND_TO = 8


class TextError(UsageError):
  """One text of a list cannot be decoded; ``index`` is its position.

  ``reason`` continues a sentence whose subject is the text, e.g. "encodes
  to no tokens", so callers can name the text their own way (a line of a
  file, a command-line flag).
  """

  def __init__(self, index: int, reason: str):
    super().__init__(f'Text {index + 1} {reason}.')
    self.index, self.reason = index, reason


def is_blank(text: str) -> bool:
  """Blank texts (empty or whitespace only) are not decoded: output ''."""
  return not text.strip()


def streamed(data_config) -> bool:
  """Whether a language model trained on data_config saw raw token windows
  (``lm_mode`` 'stream'), so that its prompts take no BOS (:func:`layout`):
  the one rule for decoding, evaluation, export and lm-eval."""
  return data.spec_for(data_config).lm_mode == 'stream'


def layout(ids: Sequence[int], model, stream: bool = False,
           tokenizer=None) -> list[int]:
  """Token ids laid out as in training: a source gets EOS after it; a prompt
  gets BOS first unless the LM was trained on a token stream (BOS and EOS
  being the tokenizer's own, ``batching.markers``)."""
  bos, eos = markers(tokenizer)
  if family_of(model).has_source:
    return data.translation_source(ids, eos)
  return data.lm_prompt(ids, stream, bos)


def encode_texts(texts: Sequence[str], tokenizer, model,
                 stream: bool = False) -> list[list[int]]:
  """Each text's ids laid out as in training; [] for a blank text.

  Raises TextError for a text that is not blank but encodes to no tokens.
  """
  rows = []
  for i, text in enumerate(texts):
    if is_blank(text):
      rows.append([])
      continue
    ids = list(tokenizer.encode(text))
    if not ids:
      raise TextError(i, 'encodes to no tokens; give some text')
    rows.append(layout(ids, model, stream, tokenizer))
  return rows


def pad_rows(rows: Sequence[Sequence[int]], width: int | None = None,
             pad_id: int = data.PAD_ID) -> np.ndarray:
  """[B, W] int32, row i = rows[i] then pad_id (W: the longest by default)."""
  width = max(map(len, rows)) if width is None else width
  out = np.full((len(rows), width), pad_id, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def encode_batch(texts: Sequence[str], tokenizer, model, *,
                 stream: bool = False, width: int | None = None
                 ) -> np.ndarray:
  """Texts as one right-padded batch of model inputs, [B, W] int32.

  The ``src_ids`` of an EncoderDecoder (ids + EOS) or the ``prompt_ids`` of
  a DecoderLM ([BOS] + ids, or ids when ``stream``); padding is PAD (0), so
  the masks ``decoding`` derives (ids != pad) mark the real tokens. Raises
  TextError for a text that is blank or encodes to no tokens.
  """
  rows = encode_texts(texts, tokenizer, model, stream)
  for i, row in enumerate(rows):
    if not row:
      raise TextError(i, 'is blank; a batch row needs at least one token')
  return pad_rows(rows, width)


def _decoder_prefix(model, width: int) -> int:
  """Positions the decoder fills before its first new token: the prompt for
  a DecoderLM, BOS for an EncoderDecoder."""
  return family_of(model).decoder_prefix(width)


def _fits(model, width: int, new_tokens: int) -> bool:
  """Whether ``decoding`` accepts rows of ``width`` and this many new
  tokens (learned positions end at max_len; other inputs only may not
  exceed it)."""
  config = model.config
  if width > config.max_len:
    return False
  return (config.positional != 'learned'
          or _decoder_prefix(model, width) + new_tokens <= config.max_len)


def new_token_limit(model, length: int,
                    max_new_tokens: int | None = None) -> int:
  """The most new tokens for one input of ``length`` ids (laid out).

  ``max_new_tokens``, or by default ``length + decoding.EXTRA_NEW_TOKENS``
  capped by a model with learned positions. Raises ValueError (a reason, as
  TextError wants it) when the input does not fit the model.
  """
  config = model.config
  if length > config.max_len:
    raise ValueError(f"is {length} tokens long, more than the model's "
                     f'max_len={config.max_len}; shorten it')
  if max_new_tokens is not None:
    if not _fits(model, length, max_new_tokens):
      raise ValueError(f'is {length} tokens long: with {max_new_tokens} new '
                       f"tokens that exceeds the model's max_len="
                       f'{config.max_len} (learned positions); shorten it '
                       'or ask for fewer new tokens')
    return max_new_tokens
  n = length + decoding.EXTRA_NEW_TOKENS
  if config.positional == 'learned':
    n = min(n, config.max_len - _decoder_prefix(model, length))
  if n < 1:
    raise ValueError(f'is {length} tokens long, leaving no room for new '
                     f"tokens under the model's max_len={config.max_len} "
                     '(learned positions); shorten it')
  return n


def _round_up(x: int, multiple: int = ROUND_TO) -> int:
  return -(-x // multiple) * multiple


def plan_batches(lengths: Sequence[int], limits: Sequence[int],
                 batch_size: int,
                 fits: Callable[[int, int], bool]) -> list[list[int]]:
  """Indices grouped into batches, longest rows first.

  A row joins the current batch while the batch has room and ``fits(width
  of the batch, most new tokens any of its rows may take)``; rows of
  length 0 (blank texts) are left out.
  """
  order = sorted((i for i, n in enumerate(lengths) if n),
                 key=lambda i: -lengths[i])
  batches: list[list[int]] = []
  for i in order:
    batch = batches[-1] if batches else None
    if (batch and len(batch) < batch_size
        and fits(lengths[batch[0]], max(limits[j] for j in batch + [i]))):
      batch.append(i)
    else:
      batches.append([i])
  return batches


def _shape(model, width: int, new_tokens: int,
           round_new_tokens: bool) -> tuple[int, int]:
  """(padded width, new tokens) for a batch: rounded up where the model
  allows, so that later batches reuse the compiled program."""
  n_round = _round_up(new_tokens) if round_new_tokens else new_tokens
  for shape in ((_round_up(width), n_round), (_round_up(width), new_tokens),
                (width, n_round)):
    if _fits(model, *shape):
      return shape
  return width, new_tokens


def _strip_eos(tokens: list[int], eos_id: int | None) -> list[int]:
  return tokens[:-1] if tokens and tokens[-1] == eos_id else tokens


def decode_texts(model, tokenizer, texts: Sequence[str], *,
                 stream: bool = False, beam_size: int = 1,
                 alpha: float = 0.6, sampler=greedy,
                 key: jax.Array | None = None,
                 max_new_tokens: int | None = None, batch_size: int = 32,
                 progress: bool = False, mesh=None,
                 rows: Sequence[Sequence[int]] | None = None,
                 stop_ids: Sequence[int] = (),
                 prefill_chunk: int | None = None) -> list[str]:
  """The decoded text of each input text, in input order.

  model: an EncoderDecoder (the outputs are translations) or a DecoderLM
    (the outputs are continuations, without the prompt).
  tokenizer: ``encode(str) -> ids`` and ``decode(ids) -> str``.
  stream: the DecoderLM was trained on raw token windows (no BOS).
  beam_size: > 1 runs :func:`decoding.beam_search` with length penalty
    ``alpha``; otherwise :func:`decoding.generate` with ``sampler``.
  key: the sampling key (required unless greedy); batch b decodes with
    ``jax.random.fold_in(key, b)``, so a key, the texts and ``batch_size``
    determine the samples.
  max_new_tokens: per text; default its length + 50 (laid out, capped by
    learned positions). Greedy and sampled rows keep their own limit inside
    a batch, so greedy outputs do not depend on the batch; beam search
    gives a batch's rows its longest limit.
  progress: a tqdm bar on stderr.
  mesh: shard each batch over the mesh's 'data' axis (see ``decoding``);
    batch_size must then divide by its size.
  rows: each text's ids already laid out (a chat's prompt,
    ``data.chat.prompt_ids``) instead of encoding texts.
  stop_ids: ids that end an output as EOS does (a chat template's
    end-of-turn tokens); the output ends before the first.
  prefill_chunk: prompts longer than this many tokens are read into the
    cache a chunk at a time (``decoding.generate``; beam search reads
    them at once).

  Blank texts (empty or whitespace only) give ''. Every text is checked
  before anything is decoded: TextError names the first that is not blank
  but encodes to nothing or does not fit the model; other bad arguments
  raise ValueError.
  """
  fields.check_integer('batch_size', batch_size)
  if beam_size > 1 and not is_deterministic(sampler):
    raise UsageError('Beam search does not sample; pass sampler=greedy or '
                     'beam_size=1.')
  if key is None and not is_deterministic(sampler):
    raise UsageError('Sampling needs a key, e.g. key=jax.random.key(0).')
  rows = ([list(r) for r in rows] if rows is not None
          else encode_texts(texts, tokenizer, model, stream))
  # Decoding stops at the tokenizer's own EOS (a Hugging Face one's may not
  # be the project's id 2); None never stops early.
  eos_id = getattr(tokenizer, 'eos_id', data.EOS_ID)
  limits = []
  for i, row in enumerate(rows):
    try:
      limits.append(new_token_limit(model, len(row), max_new_tokens)
                    if row else 0)
    except ValueError as e:
      raise TextError(i, str(e)) from None
  fits = lambda width, n: _fits(model, width, n)  # noqa: E731
  batches = plan_batches([len(r) for r in rows], limits, batch_size, fits)
  # Every batch has as many rows (the last one repeats its last row), so
  # one compiled program serves them all.
  size = max(map(len, batches), default=0)
  if mesh is not None:  # whole rows per device on the 'data' axis
    size = _round_up(size, mesh.shape.get('data', 1))
  outputs = [''] * len(texts)
  with tqdm(total=len(texts), disable=not progress, file=sys.stderr,
            unit='text', desc='decode') as bar:
    bar.update(len(texts) - sum(map(len, batches)))
    for b, batch in enumerate(batches):
      width, n = _shape(model, len(rows[batch[0]]),
                        max(limits[i] for i in batch), beam_size == 1)
      filled = batch + batch[-1:] * (size - len(batch))
      ids = pad_rows([rows[i] for i in filled], width)
      # Explicit masks: a tokenizer's id 0 may be a real token (GPT-2's).
      mask = np.arange(width) < np.array([[len(rows[i])] for i in filled])
      inputs = family_of(model).prompt_inputs(ids, mask)
      if beam_size > 1:
        out = decoding.beam_search(model, **inputs, beam_size=beam_size,
                                   alpha=alpha, max_len=n, eos_id=eos_id,
                                   mesh=mesh)
      else:
        out = decoding.generate(
            model, **inputs, max_new_tokens=n, sampler=sampler,
            key=None if key is None else jax.random.fold_in(key, b),
            eos_id=eos_id, mesh=mesh, prefill_chunk=prefill_chunk)
      for r, i in enumerate(batch):
        tokens = decoding.row_tokens(out, r)
        if beam_size == 1:
          tokens = tokens[:limits[i]]
        stop = next((k for k, t in enumerate(tokens) if t in stop_ids), None)
        if stop is not None:
          tokens = tokens[:stop]
        outputs[i] = tokenizer.decode(_strip_eos(tokens, eos_id))
      bar.update(len(batch))
  return outputs
