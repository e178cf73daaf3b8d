"""TFDS builder ``lm1b`` without TensorFlow.

TFDS's lm1b builder globs the extracted archive with ``tf.io.gfile`` and
extracts it with TFDS's TensorFlow-based extractor. This subclass changes
only that: it extracts with ``downloads.DownloadManager`` and globs with
``etils.epath``. Everything else is TFDS's (name, version 1.1.0, the feature
``text``, the splits ``train`` and ``test``, the example keys
``<file>_<line>``, the checksum of the 1.7 GB download), so the files it
writes are those TFDS writes.

The archive ``1-billion-word-language-modeling-benchmark-r13output.tar.gz``
holds ``training-monolingual.tokenized.shuffled/news.en-000NN-of-00100``
(train) and ``heldout-monolingual.tokenized.shuffled/
news.en.heldout-000NN-of-00050`` (test), one tokenised sentence a line.
"""

from __future__ import annotations

from etils import epath
from tensorflow_datasets.datasets.lm1b import lm1b_dataset_builder as tfds_lm1b

from jax_transformer.data import downloads


def split_files(root: epath.PathLike, pattern: str) -> list[str]:
  """The files of one split in the extracted archive, in name order."""
  files = sorted(str(p) for p in epath.Path(root).glob(pattern))
  if not files:
    raise FileNotFoundError(
        f'No file matches {pattern} in {root}: the lm1b archive is not the '
        'expected one (delete it to download it again).')
  return files


class Lm1b(downloads.TfFreeBuilder, tfds_lm1b.Builder):
  """TFDS's lm1b; extraction and globbing without TensorFlow."""

  def _split_generators(self, dl_manager):
    manager = self.download_manager(dl_manager)
    # pylint: disable=protected-access
    root = manager.download_and_extract(tfds_lm1b._DOWNLOAD_URL)
    return {
        'train': self._generate_examples(
            split_files(root, tfds_lm1b._TRAIN_FILE_FORMAT)),
        'test': self._generate_examples(
            split_files(root, tfds_lm1b._HELDOUT_FILE_FORMAT)),
    }
