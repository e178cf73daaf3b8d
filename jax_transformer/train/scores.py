"""Scoring a trained model: BLEU and chrF for translation, loss, perplexity
and bits per byte (or character) for language models.

Used by ``scripts/evaluate.py`` and by the trainer's periodic evaluation
(``evaluating``, its hooks), so the two compute the same numbers the same
way.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
import tensorflow_datasets as tfds
from sacrebleu.metrics import BLEU, CHRF
from tqdm import tqdm

from jax_transformer import data
from jax_transformer.data import splits
from jax_transformer.decoding import inference
from jax_transformer.errors import UsageError
from jax_transformer.experiment import DataConfig

LN2 = math.log(2.0)


def check_split(data_cfg: DataConfig, split: str) -> None:
  """Raises one ValueError sentence if the prepared dataset lacks the split
  (a slice such as 'train[-500:]' names its split before the bracket)."""
  spec = data.spec_for(data_cfg)
  try:
    source = data.load_source(spec, spec.train_split, data_cfg.data_dir)
  except FileNotFoundError as e:  # not prepared: the message says how
    raise UsageError(str(e)) from None
  del source
  builder = tfds.builder(spec.name, data_dir=data_cfg.data_dir
                         or data.default_data_dir(),
                         file_format='array_record')
  names = sorted(builder.info.splits)
  if split.split('[')[0] not in names:
    raise UsageError(f'{spec.name} has no split {split!r}; it has '
                     f'{", ".join(names)}.')


# ----------------------------------------------------------------------------
# Language models (and the loss of either model kind).


def text_unit(tokenizer) -> str:
  """What bits are counted per: 'byte' for byte tokenizers, else
  'character' (of the decoded text)."""
  return 'byte' if tokenizer.kind == data.ByteTokenizer.kind else 'character'


def count_units(tokenizer, targets: np.ndarray, weights: np.ndarray) -> int:
  """Bytes (byte tokenizer) or characters that the scored targets spell.

  targets, weights: [B, T]; each row's scored ids are decoded in order, so a
  row holding several packed sequences counts all of them.
  """
  total = 0
  for row, w in zip(np.asarray(targets), np.asarray(weights)):
    ids = row[w > 0]
    if text_unit(tokenizer) == 'byte':
      total += int(np.sum((ids >= data.tokenizers.NUM_RESERVED)
                          & (ids < tokenizer.vocab_size)))
    else:
      total += len(tokenizer.decode(ids.tolist()))
  return total


class Interrupted(Exception):
  """An evaluation abandoned because the run was asked to stop."""


def loss_metrics(eval_step: Callable, params, data_cfg: DataConfig,
                 tokenizer, mesh, rows: tuple[int, int],
                 split: str | None = None,
                 max_batches: int | None = None,
                 count_text: bool = False,
                 progress: bool = False,
                 stop: Callable[[int], bool] | None = None
                 ) -> dict[str, float]:
  """Loss and perplexity over a split of ``data_cfg`` (default: its
  eval_split) in batches of ``rows`` (batch size, tokens per row), every
  token of it unless max_batches is given.

  eval_step(params, global_batch) -> {'nll': sum, 'tokens': count}. With
  count_text, also bits per byte (byte tokenizers) or per character.
  stop(batches done) -> True abandons the evaluation (raises Interrupted),
  so a stop signal need not wait for a whole split; every process must
  give the same answer for the same count.
  """
  split = split or data_cfg.eval_split or 'validation'
  sums = _loss_sums(eval_step, params, data_cfg, tokenizer, mesh, rows,
                    split, max_batches, count_text, progress, stop)
  return _loss_row(*sums, tokenizer if count_text else None)


def mixture_loss_metrics(eval_step: Callable, params,
                         data_cfg: DataConfig, tokenizer, mesh,
                         rows: tuple[int, int],
                         max_batches: int | None = None,
                         stop: Callable[[int], bool] | None = None
                         ) -> dict[str, float]:
  """``loss_metrics`` of each source of data_cfg.mixture on its own
  eval_split (its first max_batches batches), as ``eval_loss/<label>`` and
  ``eval_perplexity/<label>``, and of all of them pooled over tokens as
  ``eval_loss`` and ``eval_perplexity``."""
  out, nll, tokens = {}, 0.0, 0.0
  for source in data.source_for(data_cfg).parts:
    s_nll, s_tokens, _ = _loss_sums(
        eval_step, params, source.data, tokenizer, mesh, rows,
        source.eval_split, max_batches, False, False, stop)
    for key, value in _loss_row(s_nll, s_tokens).items():
      out[f'{key}/{source.label}'] = value
    nll, tokens = nll + s_nll, tokens + s_tokens
  return {**_loss_row(nll, tokens), **out}


def _loss_sums(eval_step, params, data_cfg, tokenizer, mesh, rows, split,
               max_batches, count_text, progress, stop
               ) -> tuple[float, float, float]:
  """(summed nll, scored tokens, text units) over a split."""
  batch_size, seq_len = rows
  it = data.make_iterator(data_cfg, split, tokenizer,
                          batch_size=batch_size, seq_len=seq_len,
                          shuffle=False, num_epochs=1)
  batches = itertools.islice(it, max_batches)
  if progress:
    batches = _progress(batches, desc=f'scoring {split}')
  nll = tokens = units = 0.0
  # Every host runs the same number of batches (the pipeline pads shards).
  for done, local in enumerate(batches):
    if stop is not None and done and stop(done):
      raise Interrupted(f'evaluation stopped after {done} batches')
    # Summed on the host: eager ops on multi-process arrays would deadlock.
    sums = jax.device_get(eval_step(params, data.global_batch(local, mesh)))
    nll, tokens = nll + float(sums['nll']), tokens + float(sums['tokens'])
    if count_text:
      targets = local['tgt_out'] if 'tgt_out' in local else local['targets']
      weights = (local['tgt_segment_ids'] if 'tgt_out' in local
                 else local['segment_ids'])
      units += count_units(tokenizer, targets, weights)
  return nll, tokens, units


def _loss_row(nll: float, tokens: float, units: float = 0.0,
              tokenizer=None) -> dict[str, float]:
  """eval_loss and eval_perplexity; given the tokenizer, also the tokens,
  text units and bits per unit."""
  loss = nll / max(tokens, 1.0)
  out = {'eval_loss': loss, 'eval_perplexity': math.exp(min(loss, 50.0))}
  if tokenizer is not None:
    unit = text_unit(tokenizer)
    out.update({'eval_tokens': tokens, f'eval_{unit}s': units,
                f'eval_bits_per_{unit}': nll / LN2 / max(units, 1.0)})
  return out


# ----------------------------------------------------------------------------
# Translation.


def split_texts(data_cfg: DataConfig, split: str,
                max_examples: int | None = None
                ) -> tuple[list[str], list[str]]:
  """(sources, references) of a translation split, in stored order."""
  spec = data.spec_for(data_cfg)
  src_key, tgt_key = splits.translation_keys(
      spec, data_cfg.direction)
  source = data.load_source(spec, split, data_cfg.data_dir)
  n = len(source) if max_examples is None else min(max_examples, len(source))
  rows = [source[i] for i in range(n)]
  return ([data.datasets.as_text(r[src_key]) for r in rows],
          [data.datasets.as_text(r[tgt_key]) for r in rows])


def translate(model, tokenizer, sources: Sequence[str], *,
              beam_size: int = 1, alpha: float = 0.6, batch_size: int = 64,
              mesh=None, progress: bool = False) -> list[str]:
  """Translations of ``sources`` (greedy for beam_size 1), in order, through
  ``inference.decode_texts`` (sources encoded as in training, batched by
  length, KV-cached decoding, at most source length + 50 new tokens)."""
  return inference.decode_texts(model, tokenizer, sources,
                                beam_size=beam_size, alpha=alpha,
                                batch_size=batch_size, mesh=mesh,
                                progress=progress)


def bleu_and_chrf(hypotheses: Sequence[str], references: Sequence[str]
                  ) -> dict[str, Any]:
  """Corpus BLEU and chrF from sacrebleu (default settings: 13a tokenisation
  for BLEU, chrF2), each with its signature."""
  bleu, chrf = BLEU(), CHRF()
  b = bleu.corpus_score(list(hypotheses), [list(references)])
  c = chrf.corpus_score(list(hypotheses), [list(references)])
  return {'bleu': b.score, 'chrf': c.score,
          'bleu_signature': str(bleu.get_signature()),
          'chrf_signature': str(chrf.get_signature()),
          'bleu_detail': str(b)}


def bleu_metrics(model, tokenizer, data_cfg: DataConfig,
                 num_examples: int, batch_size: int) -> dict[str, float]:
  """Greedy BLEU and chrF on the first num_examples of the eval split (the
  trainer's periodic check; scripts/evaluate.py scores whole splits)."""
  sources, refs = split_texts(data_cfg, data_cfg.eval_split, num_examples)
  hyps = translate(model, tokenizer, sources, batch_size=batch_size)
  both = bleu_and_chrf(hyps, refs)
  return {'eval_bleu': both['bleu'], 'eval_chrf': both['chrf']}


def _progress(items: Iterable, **kwargs):
  total = len(items) if hasattr(items, '__len__') else None
  return tqdm(items, total=total, dynamic_ncols=True,
              disable=jax.process_index() != 0, **kwargs)
