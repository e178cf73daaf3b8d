"""TFDS builders ``wmt14_translate`` and ``wmt_t2t_translate`` without TF.

TFDS's WMT code reads the extracted files with ``etils.epath`` (plain
Python), but gets them from ``download_and_extract``, whose extractor needs
TensorFlow for every archive. These subclasses change only that, through
``downloads.TfFreeBuilder``: the subsets, parsers, configs, versions and
checksums stay TFDS's.

For ``de-en`` they read (paths inside the downloaded archives):

- train: ``training/europarl-v7.de-en.{de,en}``
  (training-parallel-europarl-v7.tgz), ``commoncrawl.de-en.{de,en}``
  (training-parallel-commoncrawl.tgz) and news commentary,
  ``training/news-commentary-v9.de-en.{de,en}`` for WMT14 or
  ``training-parallel-nc-v13/news-commentary-v13.de-en.{de,en}`` for T2T;
- validation: ``dev/newstest2013.{de,en}`` (dev.tgz), line-aligned text;
- test: ``dev/newstest2014-deen-src.de.sgm`` and ``-ref.en.sgm``, SGML with
  one ``<seg id="N">`` a line.
"""

from __future__ import annotations

from tensorflow_datasets.translate import wmt14, wmt_t2t

from jax_transformer.data import downloads


class Wmt14Translate(downloads.TfFreeBuilder, wmt14.Wmt14Translate):
  """TFDS's wmt14_translate; extraction without TensorFlow."""


class WmtT2tTranslate(downloads.TfFreeBuilder, wmt_t2t.WmtT2tTranslate):
  """TFDS's wmt_t2t_translate; extraction without TensorFlow."""
