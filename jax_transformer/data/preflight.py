"""Before the first step: what the training data gives at the run's rows.

A run whose examples are longer than its rows loses them: a translation
pair that does not fit is dropped whole (a cut target would lose its EOS),
a document or an instruction record is cut, losing its end and its EOS.
When every pair is dropped, no batch can ever be made. So before the first
step the trainer measures a sample of the prepared training split (its
token store's lengths, no token read) against the rows::

  Data (train): 400 pairs read, 0 kept, 400 dropped (longer than
  data.src_len 24 or seq_len 24 with EOS); 0 loss tokens per batch ...

and refuses in one sentence a run that keeps nothing (``Report.check``),
warns in one line where more than ``WARN_SHARE`` is cut or dropped
(``Report.warning``). ``Rows`` says what an example's rows are (built by
``pipeline.training_rows`` from a data config); this module only counts
and words, so the iterator's own refusal (``batching.PackIterator``, after
a whole pass dropped) says the same sentence (``refusal``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax_transformer.data import batching
from jax_transformer.errors import UsageError

# Examples measured, evenly spaced over the split: counting lengths is
# cheap (the store's offsets), and this many give every share to ~1%.
SAMPLE = 10_000
# A larger share cut or dropped is worth a warning.
WARN_SHARE = 0.05
# At most this many examples are packed for the loss-tokens estimate (the
# sample shuffled, repeated while no batch is full).
_PACKED_EXAMPLES = 8_192


@dataclasses.dataclass(frozen=True)
class Side:
  """One group of a training example's rows.

  name: what a user calls it ('en', 'text', 'prompt + completion');
  features: the token-store features whose ids fill it, one after
  another; markers: the ids the framing adds (EOS, BOS before a target);
  limit: its row length; flag: the config field setting it ('seq_len',
  'data.src_len').
  """
  name: str
  features: tuple[str, ...]
  markers: int
  limit: int
  flag: str

  @property
  def trained(self) -> str:
    """The part of it that trains ('completion' of 'prompt +
    completion')."""
    return self.name.split(' + ')[-1]


@dataclasses.dataclass(frozen=True)
class Rows:
  """What one training example of a dataset becomes.

  what: the word for an example ('pair', 'document', 'record'); sides:
  its groups, in the layout's order; drops: whether an example longer than
  its rows is dropped (translation) rather than cut; loss_side: the side
  whose tokens train; untrained: a feature at the start of that side that
  does not train (an instruction's prompt); layout, batch_size and pack:
  the batches (``batching``).
  """
  what: str
  sides: tuple[Side, ...]
  drops: bool
  loss_side: int
  untrained: str | None
  layout: batching.Layout
  batch_size: int
  pack: bool


def _plural(n: int, word: str) -> str:
  return f'{n:,} {word}{"" if n == 1 else "s"}'


def _percentiles(lengths: np.ndarray) -> str:
  return (f'p50 {np.percentile(lengths, 50):.0f}, p95 '
          f'{np.percentile(lengths, 95):.0f}, max {int(lengths.max())}')


def _advice(rows: Rows, lengths: np.ndarray) -> tuple[str, str]:
  """('en + EOS is p50 27, ... tokens for data.src_len 24 (400 too long);
  ...', 'raise --config.data.src_len to 29 and --config.seq_len to 29 to
  keep every pair') for the sides some example is too long for."""
  long_ = [(s, lengths[:, i]) for i, s in enumerate(rows.sides)
           if len(lengths) and (lengths[:, i] > s.limit).any()]
  if not long_:  # no lengths to tell (an iterator's refusal without them)
    flags = dict.fromkeys(f'--config.{s.flag}' for s in rows.sides)
    return (', '.join(f'{s.name} + EOS for {s.flag} {s.limit}'
                      for s in rows.sides), f'raise {" and ".join(flags)}')
  said = '; '.join(f'{s.name} + EOS is {_percentiles(n)} tokens for '
                   f'{s.flag} {s.limit} ({(n > s.limit).sum():,} too long)'
                   for s, n in long_)
  need: dict[str, int] = {}
  for s, n in long_:
    need[s.flag] = max(need.get(s.flag, 0), int(n.max()))
  to = ' and '.join(f'--config.{flag} to {n}' for flag, n in need.items())
  return said, f'raise {to} to keep every {rows.what}'


def refusal(rows: Rows, lengths: np.ndarray, read: str) -> str:
  """The sentence refusing a run none of whose examples trains: lengths
  [n, sides] of the examples (markers included), read: what they are
  ('the 400 pairs of train', "a whole pass of this host's 400 pairs")."""
  said, advice = _advice(rows, lengths)
  if rows.drops:
    return (f'Every one of {read} is longer than its rows, so no batch can '
            f'be made: {said}; {advice}.')
  return (f'No {rows.what} of {read} keeps a token of its '
          f'{rows.sides[rows.loss_side].trained} within its rows, so nothing '
          f'would train: {said}; {advice}.')


@dataclasses.dataclass(frozen=True)
class StreamReport:
  """A language model's stream (``lm_mode='stream'``): windows of
  seq_len + 1 tokens, nothing cut or dropped (a split too short for one
  window is refused where it is prepared)."""
  split: str
  tokens: int
  seq_len: int
  batch_size: int
  label: str | None = None

  def line(self) -> str:
    label = f' {self.label}' if self.label else ''
    windows = batching.num_lm_windows(self.tokens, self.seq_len)
    return (f'Data{label} ({self.split}): a stream of {self.tokens:,} tokens,'
            f' {windows:,} windows of seq_len {self.seq_len} + 1 per pass, '
            f'nothing cut or dropped; {self.batch_size * self.seq_len:,} loss '
            f'tokens per batch of {self.batch_size} x {self.seq_len}.')

  def warning(self) -> None:
    return None

  def check(self) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class Report:
  """A sample of a training split measured against its rows.

  lengths: [n, sides] of the sampled examples (markers included);
  untrained: [n] tokens of each that do not train (0 but for
  instructions); total: examples in the split; loss_tokens: the mean loss
  tokens per batch; label: the source's name in a mixture, else None.
  """
  rows: Rows
  split: str
  total: int
  lengths: np.ndarray
  untrained: np.ndarray
  loss_tokens: float = 0.0
  label: str | None = None

  @property
  def read(self) -> int:
    return len(self.lengths)

  @property
  def fits(self) -> np.ndarray:
    limits = np.asarray([s.limit for s in self.rows.sides])
    return (self.lengths <= limits).all(axis=1)

  @property
  def trains(self) -> np.ndarray:
    """Whether each example gives a loss token in training."""
    if self.rows.drops:
      return self.fits
    side = self.rows.sides[self.rows.loss_side]
    return np.minimum(self.lengths[:, self.rows.loss_side],
                      side.limit) > self.untrained

  @property
  def kept(self) -> int:
    return int(self.fits.sum())

  @property
  def cut(self) -> int:
    return 0 if self.rows.drops else self.read - self.kept

  @property
  def dropped(self) -> int:
    return self.read - self.kept if self.rows.drops else 0

  def _examples(self) -> str:
    """'the 400 pairs of train' or 'a sample of 10,000 of the 1,375,504
    documents of train' (of a mixture's source: 'of notes' after it)."""
    what = f'{self.total:,} {self.rows.what}s'
    if self.read < self.total:
      what = f'a sample of {self.read:,} of the {what}'
    else:
      what = f'the {_plural(self.total, self.rows.what)}'
    source = f' of {self.label}' if self.label else ''
    return f'{what}{source} in {self.split}'

  def line(self) -> str:
    """The pre-flight line."""
    r = self.rows
    side = r.sides[r.loss_side]
    sample = (f', a sample of {self.read:,} of {self.total:,}'
              if self.read < self.total else '')
    label = f' {self.label}' if self.label else ''
    longer = ('longer than ' + ' or '.join(f'{s.flag} {s.limit}'
                                           for s in r.sides) + ' with EOS')
    if r.drops:
      fate = f'0 cut, {self.dropped:,} dropped ({longer})'
    else:
      empty = int((~self.trains).sum())
      empty = (f'; {empty:,} with nothing of the {side.trained} left'
               if empty else '')
      fate = f'{self.cut:,} cut ({longer}{empty}), 0 dropped'
    slots = r.batch_size * side.limit
    return (f'Data{label} ({self.split}{sample}): '
            f'{_plural(self.read, r.what)} read, {self.kept:,} kept, {fate}; '
            f'about {self.loss_tokens:,.0f} loss tokens per batch of '
            f'{r.batch_size} x {side.limit} ({self.loss_tokens / slots:.0%} '
            f'of the {"packed " if r.pack else ""}rows).')

  def warning(self) -> str | None:
    """One line where more than WARN_SHARE of the examples is cut or
    dropped (and some train: else ``check`` refuses), else None."""
    long_ = int((~self.fits).sum())
    if not self.trains.any() or long_ <= WARN_SHARE * self.read:
      return None
    r = self.rows
    said, advice = _advice(r, self.lengths)
    fate = ('dropped' if r.drops else
            f'cut, losing the end of their {r.sides[r.loss_side].trained} '
            'and its EOS')
    return (f'Warning: {long_:,} of {self._examples()} '
            f'({long_ / self.read:.0%}) are longer than their rows and '
            f'{fate}: {said}; {advice}.')

  def check(self) -> None:
    """Refuses in one sentence a run in which no sampled example trains."""
    if not self.trains.any():
      raise UsageError(refusal(self.rows, self.lengths, self._examples()))


def sample_indices(total: int, sample: int = SAMPLE) -> np.ndarray:
  """Up to ``sample`` example numbers, evenly spaced over the split."""
  if total <= sample:
    return np.arange(total)
  return np.unique(np.linspace(0, total - 1, sample).round().astype(np.int64))


def measure(rows: Rows, store, split: str, *, label: str | None = None,
            sample: int = SAMPLE) -> Report:
  """A Report of ``store`` (a ``token_store.TokenStore``), a training
  split: lengths from its offsets, no ids read."""
  at = sample_indices(len(store), sample)
  counts = {f: np.diff(store.offsets(f))[at]
            for s in rows.sides for f in s.features}
  lengths = np.stack([sum(counts[f] for f in s.features) + s.markers
                      for s in rows.sides], axis=1).astype(np.int64)
  untrained = (counts[rows.untrained].astype(np.int64) if rows.untrained
               else np.zeros(len(at), np.int64))
  report = Report(rows, split, len(store), lengths, untrained, label=label)
  return dataclasses.replace(report, loss_tokens=_loss_tokens(report))


def _loss_tokens(report: Report) -> float:
  """Mean loss tokens per batch: rows of one example each (padding) hold
  the mean example's; packed rows are filled first fit, as training fills
  them, with the sample shuffled (and repeated until a batch is full)."""
  rows = report.rows
  trains = report.trains
  if not trains.any():
    return 0.0
  lengths = np.minimum(report.lengths,
                       [s.limit for s in rows.sides])[trains]
  loss = lengths[:, rows.loss_side] - report.untrained[trains]
  if not rows.pack:
    return float(rows.batch_size * loss.mean())
  order = np.random.default_rng(0).permutation(len(loss))
  packer = batching.RowPacker(rows.layout, rows.batch_size)
  full, in_batch, batches = 0.0, 0.0, 0
  for n in range(_PACKED_EXAMPLES):
    i = order[n % len(order)]
    example = {f: np.zeros(lengths[i, g], np.int32)
               for g, group in enumerate(rows.layout)
               for f in group.features}
    if not packer.add(example):
      full, batches = full + in_batch, batches + 1
      if n >= min(len(order), _PACKED_EXAMPLES // 2):
        break
      packer = batching.RowPacker(rows.layout, rows.batch_size)
      packer.add(example)
      in_batch = 0.0
    in_batch += loss[i]
  if batches:
    return full / batches
  # Fewer than a batch placed: scale what they fill to the whole rows.
  group = rows.layout[rows.loss_side]
  used = int((packer.finish()[group.segment_key] > 0).sum())
  return float(in_batch * rows.batch_size * group.length / max(used, 1))
