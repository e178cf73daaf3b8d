"""A model family as one record: what every room outside ``model/`` asks
instead of testing a model's class or a ``model_kind`` name.

A :class:`Family` says, for one ``config.model_kind``: the model class, how
a training batch becomes the model's call (loss inputs), whether the model
reads a source side (and so what a prompt is when decoding), how decoding
starts its cache, and which PyTorch layout exports it. ``FAMILIES`` holds
the registered records; :func:`family` finds one by kind, :func:`family_of`
by model. Adding a family is a model class in ``model/`` and one
:func:`register` here (docs/library.md, "Adding a model family").

Nothing here imports JAX: ``experiment`` validates ``model_kind`` against
this registry before JAX starts, so the class is named and imported on
first use (:attr:`Family.model_class`). The export layout is named, not
held: its functions live in ``interop/torch_layouts.py``, a layer above
this one, and a name keeps the record whole without importing it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping, NamedTuple

from jax_transformer.errors import UsageError

Batch = Mapping[str, Any]  # name -> [B, S] or [B, T] int32 (data.batching)
# segment_ids [B, T] -> {'segment_ids': ..., 'mask': ...}: how the caller
# tells attention where rows end (packed segments, or per-row lengths).
RowMasks = Callable[[Any], dict]


class ModelCall(NamedTuple):
  """One training batch as the model's call and what its loss compares."""
  args: tuple         # positional arguments of ``model(...)``
  kwargs: dict        # keyword arguments (the caller adds deterministic...)
  targets: Any        # [B, T] int32, the ids the logits predict
  weights: Any        # [B, T] bool, the positions the loss counts


@dataclasses.dataclass(frozen=True)
class Family:
  """One kind of model, as every room outside ``model/`` sees it.

  kind: its ``config.model_kind`` (and a workdir's, an export's).
  class_path: 'module:Class' of its model, imported on first use.
  has_source: it reads a source sequence [B, S] (an encoder's input)
    beside the decoder's; then a text to decode is the source and the
    decoder starts from BOS, else the text is the prompt it continues.
  loss_call: (batch, row_masks) -> :class:`ModelCall`, for the batch
    format of ``data.batching`` this family trains on.
  empty_cache: (model, batch size B, src [B, S] or None, src_mask or None,
    cache_len) -> the KV cache decoding starts from (a source is encoded
    into it once); None for a family that does not generate text.
  torch_layout: the name of its PyTorch layout in
    ``interop.torch_layouts.LAYOUTS``; None for a family without one.
  balances_rows: its batch is causal rows, every field [B, T], which the
    step may reorder along T for split rows (``model.balance``): its model
    then takes ``balanced=True``.
  """
  kind: str
  class_path: str
  has_source: bool
  loss_call: Callable[[Batch, RowMasks], ModelCall]
  empty_cache: Callable[..., Any] | None = None
  torch_layout: str | None = None
  balances_rows: bool = False

  @property
  def model_class(self) -> type:
    """The model's class (importing it imports JAX)."""
    module, name = self.class_path.split(':')
    return getattr(importlib.import_module(module), name)

  @property
  def prompt_name(self) -> str:
    """What decoding calls the text it is given: 'src' or 'prompt'."""
    return 'src' if self.has_source else 'prompt'

  def prompt_inputs(self, ids, mask=None) -> dict[str, Any]:
    """ids [B, W] (and mask [B, W]) as ``decoding.generate``'s keyword
    arguments: ``src_ids``/``src_mask`` or ``prompt_ids``/``prompt_mask``."""
    return {f'{self.prompt_name}_ids': ids,
            f'{self.prompt_name}_mask': mask}

  def decoder_prefix(self, width: int) -> int:
    """Decoder positions filled before the first new token when decoding
    inputs of ``width`` tokens: BOS alone after a source, else the prompt."""
    return 1 if self.has_source else width


# ----------------------------------------------------------------------------
# The two families' batch-to-call and cache functions.


def _lm_loss_call(batch: Batch, row_masks: RowMasks) -> ModelCall:
  """An LM batch (``inputs``, ``targets``, ``segment_ids``, ``positions``,
  optionally ``loss_mask``) as ``DecoderLM(ids, mask, ...)``."""
  rows = row_masks(batch['segment_ids'])
  weights = batch['segment_ids'] > 0
  if 'loss_mask' in batch:  # instruction data: the completions alone
    weights = weights & (batch['loss_mask'] > 0)
  return ModelCall((batch['inputs'], rows.get('mask')),
                   {'segment_ids': rows['segment_ids'],
                    'positions': batch['positions']},
                   batch['targets'], weights)


def _translation_loss_call(batch: Batch, row_masks: RowMasks) -> ModelCall:
  """A translation batch (``src``, ``tgt_in``, ``tgt_out`` and each side's
  segments and positions) as ``EncoderDecoder(src, tgt, ...)``."""
  src = row_masks(batch['src_segment_ids'])
  tgt = row_masks(batch['tgt_segment_ids'])
  return ModelCall((batch['src'], batch['tgt_in'], src.get('mask'),
                    tgt.get('mask')),
                   {'src_segment_ids': src['segment_ids'],
                    'tgt_segment_ids': tgt['segment_ids'],
                    'src_positions': batch['src_positions'],
                    'tgt_positions': batch['tgt_positions']},
                   batch['tgt_out'], batch['tgt_segment_ids'] > 0)


def _lm_cache(model, batch_size: int, src, src_mask, cache_len: int):
  del src, src_mask  # a decoder LM has no source
  return model.init_cache(batch_size, cache_len)


def _translation_cache(model, batch_size: int, src, src_mask,
                       cache_len: int):
  del batch_size  # src's
  # Cross-attention keys/values are projected from this once per source.
  memory = model.encode(src, src_mask)
  return model.init_cache(memory, src_mask, cache_len)


# ----------------------------------------------------------------------------
# The registry.

FAMILIES: dict[str, Family] = {}


def register(record: Family) -> Family:
  """Adds ``record`` under its kind; refuses a kind already taken."""
  if record.kind in FAMILIES:
    raise ValueError(f'A model family {record.kind!r} is already '
                     'registered.')
  FAMILIES[record.kind] = record
  return record


def family(kind: str) -> Family:
  """The family of a ``model_kind``; UsageError naming the known ones."""
  try:
    return FAMILIES[kind]
  except (KeyError, TypeError):
    raise UsageError(f'model_kind must be one of {sorted(FAMILIES)}, got '
                     f'{kind!r}.') from None


def family_of(model) -> Family:
  """The family of ``model``'s own class, else of the first class it
  derives from (a family may subclass another's model); TypeError for an
  object no family builds."""
  for record in FAMILIES.values():
    if type(model) is record.model_class:
      return record
  for record in FAMILIES.values():
    if isinstance(model, record.model_class):
      return record
  names = ' or '.join(r.class_path.split(':')[1] for r in FAMILIES.values())
  raise TypeError(f'model must be a jax_transformer {names}, got '
                  f'{type(model).__name__}.')


# The paper's model first: errors name the classes in this order.
ENCODER_DECODER = register(Family(
    kind='encoder_decoder',
    class_path='jax_transformer.model.models:EncoderDecoder',
    has_source=True, loss_call=_translation_loss_call,
    empty_cache=_translation_cache, torch_layout='reference'))
DECODER_LM = register(Family(
    kind='decoder_lm', class_path='jax_transformer.model.models:DecoderLM',
    has_source=False, loss_call=_lm_loss_call, empty_cache=_lm_cache,
    torch_layout='gpt2', balances_rows=True))
