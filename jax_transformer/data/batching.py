"""From token ids to fixed-shape batches: truncation, padding and packing.

Batches are dicts of numpy int32 arrays with static shapes, so the jitted
train step compiles once (one shape for training, and the same shape for
evaluation, whose last batch is filled with empty rows).

Language model (B batch, T length)::

  inputs       [B, T]  token ids fed to the model
  targets      [B, T]  the next token at each position
  segment_ids  [B, T]  1, 2, ... per sequence in the row; 0 on padding
  positions    [B, T]  0, 1, ... restarting at each sequence; 0 on padding
  loss_mask    [B, T]  instruction data only (``instruction_layout``): 1
                       where the target is a completion token (or its EOS),
                       0 on the prompt, so only completions train

Translation (S source length, T target length)::

  src              [B, S]  source ids + EOS
  src_segment_ids  [B, S]
  src_positions    [B, S]
  tgt_in           [B, T]  BOS + target   (decoder input, teacher forcing)
  tgt_out          [B, T]  target + EOS   (what the decoder must predict)
  tgt_segment_ids  [B, T]
  tgt_positions    [B, T]

Rows are framed with the tokenizer's own BOS and EOS (``markers``: a GPT-2
or Llama 3 tokenizer's, the reserved ids 1 and 2 of the project's own
tokenizers).

The loss weights are ``segment_ids > 0`` (``tgt_segment_ids > 0`` for
translation), times ``loss_mask`` where a batch has one: padding has
segment 0 and every real token a positive one. An unpacked row holds one
sequence (segment 1); a packed row holds several whole sequences one after
another, and attention must not cross a segment boundary
(the models do this given ``segment_ids``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import grain
import numpy as np

from jax_transformer.data.tokenizers import BOS_ID, EOS_ID
from jax_transformer.errors import UsageError

Example = Mapping[str, np.ndarray]  # feature -> 1-D int array
Batch = dict[str, np.ndarray]       # feature -> [B, L] int32


@dataclasses.dataclass(frozen=True)
class Group:
  """Features that share one row length, segment ids and positions."""
  features: tuple[str, ...]
  length: int
  segment_key: str
  position_key: str


Layout = tuple[Group, ...]


def lm_layout(seq_len: int) -> Layout:
  """inputs/targets [B, T] with segment_ids/positions."""
  return (Group(('inputs', 'targets'), seq_len, 'segment_ids', 'positions'),)


def instruction_layout(seq_len: int) -> Layout:
  """lm_layout plus loss_mask [B, T] (see ``instruction_example``)."""
  return (Group(('inputs', 'targets', 'loss_mask'), seq_len, 'segment_ids',
                'positions'),)


def translation_layout(src_len: int, tgt_len: int) -> Layout:
  """src [B, S] and tgt_in/tgt_out [B, T], each side with its own segments."""
  return (Group(('src',), src_len, 'src_segment_ids', 'src_positions'),
          Group(('tgt_in', 'tgt_out'), tgt_len, 'tgt_segment_ids',
                'tgt_positions'))


def batch_keys(layout: Layout) -> tuple[str, ...]:
  """Every key of a batch with this layout."""
  keys = []
  for g in layout:
    keys += [*g.features, g.segment_key, g.position_key]
  return tuple(keys)


def _ids(x: Sequence[int]) -> np.ndarray:
  return np.asarray(x, dtype=np.int32).reshape(-1)


def _framed(first: int | None, ids: np.ndarray, last: int | None
            ) -> np.ndarray:
  """[first] + ids + [last] (each end optional) as int32, in one copy: the
  input pipeline builds millions of these."""
  head, tail = first is not None, last is not None
  out = np.empty(len(ids) + head + tail, np.int32)
  out[head:head + len(ids)] = ids
  if head:
    out[0] = first
  if tail:
    out[-1] = last
  return out


def markers(tokenizer: Any) -> tuple[int, int]:
  """(BOS, EOS) that rows are framed with: the tokenizer's own (a GPT-2
  tokenizer's <|endoftext|> is both; one without BOS starts rows with its
  EOS), else the reserved ids 1 and 2 (the project's own tokenizers have
  exactly those, so their batches are unchanged)."""
  bos = getattr(tokenizer, 'bos_id', None)
  eos = getattr(tokenizer, 'eos_id', None)
  return (bos if bos is not None else eos if eos is not None else BOS_ID,
          eos if eos is not None else EOS_ID)


def lm_example(ids: Sequence[int], bos: int = BOS_ID, eos: int = EOS_ID
               ) -> dict[str, np.ndarray]:
  """One sequence for next-token prediction: [BOS]+ids -> ids+[EOS] (L+1)."""
  ids = _ids(ids)
  return {'inputs': _framed(bos, ids, None),
          'targets': _framed(None, ids, eos)}


def instruction_example(prompt_ids: Sequence[int],
                        completion_ids: Sequence[int], bos: int = BOS_ID,
                        eos: int = EOS_ID, last_only: bool = False
                        ) -> dict[str, np.ndarray]:
  """[BOS]+prompt+completion -> prompt+completion+[EOS], with loss_mask 1
  on the completion's targets and its EOS only (P + C + 1 each).

  A chat record's completion (``data/chat.py``) also holds the context
  between its assistant turns, each id that does not train stored as
  -(id + 1): those targets get loss_mask 0. last_only: only the last run
  of trained targets (the last assistant turn and the EOS) keeps 1."""
  prompt, completion = _ids(prompt_ids), _ids(completion_ids)
  context = completion < 0
  if context.any():
    completion = np.where(context, -completion - 1, completion)
  ids = np.concatenate([prompt, completion])
  mask = np.zeros(len(ids) + 1, np.int32)
  mask[len(prompt):] = 1
  if context.any():
    mask[len(prompt):-1][context] = 0
    if last_only:
      mask[:len(prompt) + int(np.flatnonzero(context)[-1]) + 1] = 0
  return {'inputs': _framed(bos, ids, None),
          'targets': _framed(None, ids, eos), 'loss_mask': mask}


def translation_example(src_ids: Sequence[int], tgt_ids: Sequence[int],
                        bos: int = BOS_ID, eos: int = EOS_ID
                        ) -> dict[str, np.ndarray]:
  """src+[EOS]; tgt_in = [BOS]+tgt and tgt_out = tgt+[EOS] (teacher forcing)."""
  src, tgt = _ids(src_ids), _ids(tgt_ids)
  return {'src': _framed(None, src, eos),  # translation_source(src)
          'tgt_in': _framed(bos, tgt, None),
          'tgt_out': _framed(None, tgt, eos)}


def lm_prompt(ids: Sequence[int], stream: bool, bos: int = BOS_ID
              ) -> list[int]:
  """A prompt laid out as in training: a stream LM (lm_mode 'stream') saw
  raw token windows, a per-example LM saw BOS first (``markers``)."""
  return list(ids) if stream else [bos, *ids]


def translation_source(ids: Sequence[int], eos: int = EOS_ID) -> list[int]:
  """A source sentence as in training: ids + [EOS]."""
  return [*ids, eos]


def empty_example(layout: Layout) -> dict[str, np.ndarray]:
  """A zero-length example: fills one row with padding (evaluation filler)."""
  return {f: np.zeros((0,), np.int32) for g in layout for f in g.features}


def _group_len(example: Example, group: Group) -> int:
  n = len(example[group.features[0]])
  for f in group.features[1:]:
    if len(example[f]) != n:
      raise ValueError(f'Features {group.features} must have one length, got '
                       f'{[len(example[x]) for x in group.features]}')
  return n


def fits(example: Example, layout: Layout) -> bool:
  """Whether every group of the example fits its row length (no truncation)."""
  return all(_group_len(example, g) <= g.length for g in layout)


def truncate(example: Example, layout: Layout) -> dict[str, np.ndarray]:
  """Cuts each feature to its row length (keeps the first tokens).

  inputs/targets (and tgt_in/tgt_out) are cut at the same place, so they stay
  aligned; a cut target loses its EOS, which is why training filters with
  ``fits`` instead and only evaluation truncates.
  """
  out = dict(example)
  for g in layout:
    for f in g.features:
      out[f] = np.asarray(example[f], np.int32)[:g.length]
  return out


class RowPacker:
  """Places whole examples into the B rows of one batch, first fit, in order.

  With ``max_segments_per_row=1`` this is plain padding: one example per row.
  ``add`` returns False when the example fits in no row; the caller then
  emits ``finish()`` and starts the next batch with that example, so a batch
  is always made of consecutive examples (what makes the iterator resumable).
  """

  def __init__(self, layout: Layout, batch_size: int,
               max_segments_per_row: int | None = None):
    self.layout = layout
    self.batch_size = batch_size
    self.max_segments = max_segments_per_row
    self._arrays = {k: np.zeros((batch_size, g.length), np.int32)
                    for g in layout
                    for k in (*g.features, g.segment_key, g.position_key)}
    self._room = [g.length for g in layout]
    # Free slots per group and row; a row takes an example when every group
    # has room for it.
    self._free = [np.full((batch_size,), g.length, np.int64) for g in layout]
    self._segments = np.zeros((batch_size,), np.int64)  # sequences per row
    self._positions = np.arange(max(self._room), dtype=np.int32)
    self.num_examples = 0

  @property
  def empty(self) -> bool:
    return self.num_examples == 0

  def _find_row(self, lens: list[int]) -> int | None:
    if self.max_segments == 1:  # padding: rows fill in order
      return self.num_examples if self.num_examples < self.batch_size else None
    ok = self._free[0] >= lens[0]
    for free, n in zip(self._free[1:], lens[1:]):
      ok &= free >= n
    if self.max_segments is not None:
      ok &= self._segments < self.max_segments
    row = int(ok.argmax())
    return row if ok[row] else None

  def add(self, example: Example) -> bool:
    """Puts the example in the first row with room; False if there is none."""
    lens = [_group_len(example, g) for g in self.layout]
    if any(n > room for n, room in zip(lens, self._room)):
      raise ValueError(f'Example lengths {lens} exceed the row lengths '
                       f'{self._room}; truncate or filter it first.')
    row = self._find_row(lens)
    if row is None:
      return False
    self._segments[row] += 1
    segment = self._segments[row]
    for g, room, free, n in zip(self.layout, self._room, self._free, lens):
      start = room - int(free[row])
      end = start + n
      for f in g.features:
        self._arrays[f][row, start:end] = example[f]
      self._arrays[g.segment_key][row, start:end] = segment
      self._arrays[g.position_key][row, start:end] = self._positions[:n]
      free[row] -= n
    self.num_examples += 1
    return True

  def finish(self) -> Batch:
    """The batch; rows that got no example are all padding (segment 0)."""
    return self._arrays


def batch_examples(examples: Iterable[Example], layout: Layout,
                   batch_size: int, *, pack: bool = False,
                   drop_remainder: bool = False) -> Iterator[Batch]:
  """Groups examples into padded (or packed) fixed-shape batches, in order.

  Examples must already fit (``fits``/``truncate``). The last batch is padded
  with empty rows unless ``drop_remainder``.
  """
  max_segments = None if pack else 1
  packer = RowPacker(layout, batch_size, max_segments)
  for example in examples:
    if not packer.add(example):
      yield packer.finish()
      packer = RowPacker(layout, batch_size, max_segments)
      packer.add(example)
  if not packer.empty and not drop_remainder:
    yield packer.finish()


def lm_window(tokens: np.ndarray, index: int, seq_len: int) -> Batch:
  """Window ``index`` of a token stream: inputs [T], targets [T] (shifted by 1).

  Windows start every T tokens and read T+1, so each stream token (but the
  first) is a target exactly once per epoch. No padding: segment 1 throughout.
  """
  start = index * seq_len
  chunk = np.asarray(tokens[start:start + seq_len + 1], np.int32)
  if len(chunk) != seq_len + 1:
    raise IndexError(f'Window {index} runs past the stream end.')
  return {'inputs': chunk[:-1], 'targets': chunk[1:],
          'segment_ids': np.ones((seq_len,), np.int32),
          'positions': np.arange(seq_len, dtype=np.int32)}


def num_lm_windows(num_tokens: int, seq_len: int) -> int:
  """How many full windows of T+1 tokens a stream of num_tokens yields."""
  return max(0, (num_tokens - 1) // seq_len)


# --------------------------------------------------------------------------
# Grain adapter: the packer as a resumable IterDataset.
#
# The parent yields chunks (lists) of examples rather than single examples:
# Grain's per-element overhead (futures, stats) is then paid once per chunk,
# and reader threads work on a chunk at a time. ``Dropped`` (or ``None``)
# entries are examples dropped by a filter.


class Dropped(NamedTuple):
  """A training example left out because it is longer than its rows:
  its length in each group of the layout (what a refusal reports)."""
  lengths: tuple[int, ...]


def dropped(example: Example, layout: Layout) -> Dropped:
  return Dropped(tuple(_group_len(example, g) for g in layout))


# Lengths of dropped examples a refusal keeps to describe (p50, max): at
# most a pass's, and this many.
_KEPT_LENGTHS = 10_000


class PackIterator(grain.DatasetIterator):
  """Batches from an iterator of example chunks; resumable between batches.

  The state is (parent state before the current chunk, offset of the next
  example in it). A batch is made of consecutive examples, and the example
  that did not fit opens the next batch, so a restored iterator yields
  exactly the batches an uninterrupted one would.

  ``pass_length`` (examples in one pass of the parent's data) bounds the
  search for an example that is not dropped: after twice that many dropped
  in a row (every window that long holds a whole pass, however each pass
  is shuffled), no example of the data fits, and the iterator raises a
  UsageError saying ``refusal(lengths of the dropped)`` instead of reading
  forever.
  """

  def __init__(self, parent: grain.DatasetIterator, layout: Layout,
               batch_size: int, max_segments: int | None,
               drop_remainder: bool, pass_length: int | None = None,
               refusal: Callable[[np.ndarray], str] | None = None):
    super().__init__(parent)
    self._layout = layout
    self._batch_size = batch_size
    self._max_segments = max_segments
    self._drop_remainder = drop_remainder
    self._chunk: list | None = None
    self._offset = 0            # next example in _chunk
    self._chunk_state = None    # parent state before _chunk was read
    self._exhausted = False
    self._give_up_after = 2 * pass_length if pass_length else None
    self._keep_lengths = min(pass_length or _KEPT_LENGTHS, _KEPT_LENGTHS)
    self._refusal = refusal  # not a bound method: no cycle keeps self
    self._dropped_in_a_row = 0
    self._dropped_lengths: list[tuple[int, ...]] = []

  def _read_chunk(self) -> None:
    self._chunk_state = self._parent.get_state()
    self._chunk = list(next(self._parent))
    self._offset = 0

  def _peek(self) -> Example:
    """The next example, not consumed; StopIteration at the end; a
    UsageError when a whole pass of the data was dropped."""
    while True:
      if self._chunk is None or self._offset >= len(self._chunk):
        self._read_chunk()
      example = self._chunk[self._offset]
      if example is not None and type(example) is not Dropped:
        if self._dropped_in_a_row:
          self._dropped_in_a_row = 0
          self._dropped_lengths.clear()
        return example
      self._offset += 1
      self._dropped_in_a_row += 1
      if (isinstance(example, Dropped)
          and len(self._dropped_lengths) < self._keep_lengths):
        self._dropped_lengths.append(example.lengths)
      if (self._give_up_after is not None
          and self._dropped_in_a_row >= self._give_up_after):
        lengths = np.asarray(self._dropped_lengths, np.int64).reshape(
            -1, len(self._layout))
        raise UsageError((self._refusal or self._default_refusal)(lengths))

  def _default_refusal(self, lengths: np.ndarray) -> str:
    rows = ', '.join(str(g.length) for g in self._layout)
    longest = (f' (the longest {", ".join(map(str, lengths.max(0)))})'
               if len(lengths) else '')
    return (f'No example of a whole pass of the training data fits its '
            f'rows of {rows} tokens{longest}, so no batch can be made; '
            'raise the row lengths.')

  def __next__(self) -> Batch:
    if self._exhausted:
      raise StopIteration
    packer = RowPacker(self._layout, self._batch_size, self._max_segments)
    while True:
      try:
        example = self._peek()
      except StopIteration:
        self._exhausted = True
        if packer.empty or self._drop_remainder:
          raise
        return packer.finish()
      if not packer.add(example):
        return packer.finish()  # this example opens the next batch
      self._offset += 1

  def get_state(self) -> dict[str, Any]:
    if self._chunk is None or self._offset >= len(self._chunk):
      return {'parent': self._parent.get_state(), 'offset': 0}
    return {'parent': self._chunk_state, 'offset': self._offset}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state['parent'])
    self._chunk, self._offset, self._exhausted = None, 0, False
    if state['offset']:
      self._read_chunk()
      self._offset = state['offset']


class PackAndBatchIterDataset(grain.IterDataset):
  """IterDataset of example chunks -> IterDataset of fixed-shape batches.

  ``pack=False`` pads one example per row; ``pack=True`` fills each row with
  as many whole examples as fit (first fit over the B rows of a batch).
  """

  def __init__(self, parent: grain.IterDataset, layout: Layout,
               batch_size: int, *, pack: bool, drop_remainder: bool = False,
               pass_length: int | None = None,
               refusal: Callable[[np.ndarray], str] | None = None):
    super().__init__(parent)
    self._layout = layout
    self._batch_size = batch_size
    self._pack = pack
    self._drop_remainder = drop_remainder
    self._pass_length = pass_length
    self._refusal = refusal

  def __iter__(self) -> PackIterator:
    return PackIterator(self._parent.__iter__(), self._layout,
                        self._batch_size, None if self._pack else 1,
                        self._drop_remainder, self._pass_length,
                        self._refusal)

  def __str__(self) -> str:
    return (f'PackAndBatchIterDataset(batch_size={self._batch_size}, '
            f'pack={self._pack})')


# Examples per element of the Grain pipelines below (see above).
CHUNK_SIZE = 64


def pack_and_batch(examples: grain.MapDataset, layout: Layout,
                   batch_size: int, *, pack: bool,
                   read_options: grain.ReadOptions | None = None,
                   chunk_size: int = CHUNK_SIZE,
                   drop_remainder: bool = False,
                   pass_length: int | None = None,
                   refusal: Callable[[np.ndarray], str] | None = None
                   ) -> PackAndBatchIterDataset:
  """MapDataset of examples (``Dropped`` or None = skip) -> IterDataset of
  batches [B, L]; pass_length and refusal: see ``PackIterator``."""
  chunks = examples.batch(chunk_size, batch_fn=list)
  return PackAndBatchIterDataset(chunks.to_iter_dataset(read_options), layout,
                                 batch_size, pack=pack,
                                 drop_remainder=drop_remainder,
                                 pass_length=pass_length, refusal=refusal)
