"""TFDS builder ``ding_en_de``: English-German sentence pairs from Ding.

Source: the German-English dictionary of TU Chemnitz (Frank Richter), shipped
for the ``trans`` tool by the Debian package trans-de-en as
``/usr/share/trans/de-en`` (``apt-get install trans-de-en``). It is GPL-2+:
it is read at prepare time and never copied into this repository.

Each line is ``DE | DE ... :: EN | EN ...``. ``|`` separates sub-entries that
are aligned between the sides (headword, plural, idioms, example sentences),
``;`` separates alternatives, and ``{f}``, ``[ugs.]``, ``<...>`` and
``(...)`` are annotations. We keep the example sentences:

1. split the line at `` :: `` and each side at `` | ``; skip lines whose sides
   have different numbers of sub-entries (their alignment is unknown);
2. split each aligned sub-entry at ``;`` and pair every German alternative
   with every English one (all are translations of each other);
3. delete ``[...]``, ``{...}``, ``<...>`` and ``(...)`` annotations (in
   sentences they are labels such as ``[Br.]`` or optional words), normalise
   typographic apostrophes and collapse spaces;
4. keep a pair when both sides are sentence-like: start with an upper-case
   letter, end with ``.``, ``!`` or ``?``, have at least three words, and
   contain no ``/`` (inline alternatives), ``…`` (placeholders) or leftover
   bracket.

Duplicates are removed. The split is a hash of the English sentence: about 3%
goes to ``validation`` (so alternatives of one English sentence never straddle
the splits); the rest is ``train``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Iterable, Iterator

import tensorflow_datasets as tfds

DEFAULT_PATH = '/usr/share/trans/de-en'
VALIDATION_PERCENT = 3
MIN_WORDS = 3
_INSTALL_HINT = ('The Ding dictionary comes from the Debian/Ubuntu package '
                 'trans-de-en. Install it with:\n'
                 '  sudo apt-get install trans-de-en\n'
                 '(it provides /usr/share/trans/de-en), or pass source_path.')

_ANNOTATION = re.compile(r'\s*(\[[^\]]*\]|\{[^}]*\}|<[^>]*>|\([^)]*\))')
_FORBIDDEN = re.compile(r'[\[\]{}<>()/…|;]')
_SPACES = re.compile(r'\s+')
_ENDS_SENTENCE = re.compile(r'[.!?]$')
_PUNCTUATION = re.compile(r'[.!?]')


def clean(text: str) -> str:
  """Drops annotations, normalises apostrophes and spaces."""
  text = _ANNOTATION.sub('', text)
  text = text.replace('\u2019', "'").replace('\u2018', "'")
  # Deleting "(of)" in "Apropos (of) the" leaves spaces before punctuation.
  text = re.sub(r'\s+([.!?,])', r'\1', text)
  return _SPACES.sub(' ', text).strip()


def is_sentence(text: str, min_words: int = MIN_WORDS) -> bool:
  """Upper-case start, final . ! ?, enough words, no leftover markup."""
  return (text[:1].isupper() and bool(_ENDS_SENTENCE.search(text))
          and len(text.split()) >= min_words and not _FORBIDDEN.search(text))


def line_pairs(line: str) -> Iterator[tuple[str, str]]:
  """(en, de) sentence pairs of one dictionary line (maybe none)."""
  if line.startswith('#') or ' :: ' not in line:
    return
  de_side, en_side = line.rstrip('\n').split(' :: ', 1)
  de_entries, en_entries = de_side.split(' | '), en_side.split(' | ')
  if len(de_entries) != len(en_entries):
    return
  for de_entry, en_entry in zip(de_entries, en_entries):
    de_sentences = sentences(de_entry)
    if de_sentences:
      for de, en in itertools.product(de_sentences, sentences(en_entry)):
        yield en, de


def sentences(entry: str) -> list[str]:
  """The alternatives of one entry (split at ';') that are sentences once
  cleaned, in order. An alternative without . ! or ? cannot end as one
  (cleaning only deletes), so it is not cleaned: most are not, and cleaning
  is most of the time a dictionary takes to read."""
  cleaned = (clean(a) for a in entry.split(';') if _PUNCTUATION.search(a))
  return [text for text in cleaned if is_sentence(text)]


def extract_pairs(lines: Iterable[str]) -> list[tuple[str, str]]:
  """Unique (en, de) pairs of all lines, in first-seen order."""
  seen = {}
  for line in lines:
    for pair in line_pairs(line):
      seen.setdefault(pair, None)
  return list(seen)


def is_validation(en: str, percent: int = VALIDATION_PERCENT) -> bool:
  """Stable across runs and machines (unlike Python's salted hash())."""
  digest = hashlib.sha256(en.encode('utf-8')).digest()
  return int.from_bytes(digest[:8], 'little') % 100 < percent


class DingEnDe(tfds.core.GeneratorBasedBuilder):
  """English-German example sentences of the Ding dictionary; see module doc."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Sentence pairs; 3% validation by hash of en.'}

  def __init__(self, *, source_path: str | None = None, **kwargs):
    """source_path: a file in the Ding format (default: trans-de-en's)."""
    kwargs.setdefault('file_format', 'array_record')
    super().__init__(**kwargs)
    self._source_path = source_path or DEFAULT_PATH

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__.split('\n\n')[0],
        features=tfds.features.FeaturesDict({
            'en': tfds.features.Text(),
            'de': tfds.features.Text(),
        }),
        supervised_keys=('en', 'de'),
        homepage='https://dict.tu-chemnitz.de/',
        license='GPL-2.0-or-later',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    if not os.path.exists(self._source_path):
      raise FileNotFoundError(
          f'Ding dictionary not found at {self._source_path}. {_INSTALL_HINT}')
    with open(self._source_path, encoding='utf-8') as f:
      pairs = extract_pairs(f)
    train = [p for p in pairs if not is_validation(p[0])]
    validation = [p for p in pairs if is_validation(p[0])]
    return {'train': self._generate_examples(train),
            'validation': self._generate_examples(validation)}

  def _generate_examples(self, pairs: list[tuple[str, str]]
                         ) -> Iterator[tuple[str, dict[str, str]]]:
    for en, de in pairs:
      # Unique pairs make unique keys; TFDS shuffles by key hash on write.
      yield f'{en}\t{de}', {'en': en, 'de': de}
