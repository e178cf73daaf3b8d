"""Hugging Face datasets as TFDS datasets: ``data.name='huggingface:...'``.

Two forms, both needing the ``datasets`` library (``pip install
'jax_transformer[hf]'``) only while they are prepared:

* ``data.name='huggingface:OWNER/NAME'`` (the id as on the Hub, with
  ``data.hf.config`` for a dataset with several configs): built by TFDS's
  own ``huggingface:`` builder (``HuggingfaceDatasetBuilder``), which asks
  ``datasets`` for the data (downloaded, or from its cache) and writes the
  TFDS ArrayRecord files::

    <data_dir>/<owner>__<name>/[<config>/]<version>/...

  Offline (``HF_DATASETS_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``) ``datasets``
  reads a dataset it has downloaded before from its cache
  (``$HF_DATASETS_CACHE``). TFDS's builder also asks the Hub for the
  dataset's card (licence, gating) and ``tfds.builder('huggingface:...')``
  lists every dataset of the Hub to find the id; here the builder is made
  directly from the id and, offline or when the Hub cannot be reached, goes
  without the card.
* ``data.name='huggingface'`` with ``data.hf.path=FOLDER``: a folder written
  by ``datasets``' ``save_to_disk`` (a ``DatasetDict``, its splits, or one
  ``Dataset``, the ``train`` split). TFDS's builder cannot read such a
  folder, so it is read with ``datasets.load_from_disk`` and written, its
  text columns only, as a TFDS ArrayRecord dataset::

    <data_dir>/huggingface_disk/<fingerprint>/1.0.0/...

  where the fingerprint hashes the text keys and each split's fingerprint
  and file sizes (``state.json``), so a changed dataset is prepared again.

Either is then read like any TFDS dataset by name, and tokenized into a
token store. Splits keep their names (``train``, ``validation``, ``test``);
a dataset with ``train`` alone is split with slices, e.g.
``data.train_split='train[:99%]'`` and ``data.eval_split='train[99%:]'``.
A prepared dataset is not prepared again: delete its folder under
``data_dir`` to read a newer download.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import json
import os
import re
import types
from collections.abc import Sequence
from typing import Any

import tensorflow_datasets as tfds
from tensorflow_datasets.core.dataset_builders import (
    huggingface_dataset_builder as hfb,
)
from tensorflow_datasets.core.utils import conversion_utils

# Imported on first use (TFDS's lazy module): ``datasets`` is optional.
from tensorflow_datasets.core.utils.lazy_imports_utils import (
    datasets as hf_lib,
)

from jax_transformer.data import files
from jax_transformer.errors import UsageError, first_line

PREFIX = 'huggingface'
DISK_BUILDER = 'huggingface_disk'
VERSION = '1.0.0'
EXTRA = "pip install 'jax_transformer[hf]'"
_ID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$')


def is_huggingface(name: str) -> bool:
  return name == PREFIX or name.startswith(PREFIX + ':')


def spec_fields(name: str, data_cfg: Any, keys: Sequence[str]
                ) -> tuple[str, tuple]:
  """(the TFDS name it is read under, what to build it from) for
  ``data.name`` ``'huggingface:OWNER/NAME'`` or ``'huggingface'`` with
  ``data.hf.path``; refuses a malformed one in one sentence."""
  hf_path, hf_config = data_cfg.hf.path, data_cfg.hf.config
  if name == PREFIX:
    if not hf_path:
      raise UsageError(
          "config.data.name='huggingface' reads a folder written by "
          "save_to_disk, given by config.data.hf.path; for a dataset of the "
          "Hub give config.data.name='huggingface:OWNER/NAME'.")
    if hf_config:
      raise UsageError('config.data.hf.config names a config of a dataset of '
                       'the Hub; a save_to_disk folder (config.data.hf.path) '
                       'has none.')
    folder, splits = _disk_splits(str(hf_path))
    fp = _disk_fingerprint(folder, splits, keys)
    return f'{DISK_BUILDER}/{fp}', ('disk', folder, splits)
  repo_id = name[len(PREFIX) + 1:]
  if hf_path:
    raise UsageError(f'config.data.name={name!r} reads the Hub (or its '
                     'cache); config.data.hf.path goes with '
                     "config.data.name='huggingface'. Set one of them.")
  if not _ID.match(repo_id):
    raise UsageError(
        f'config.data.name={name!r}: give the dataset\'s id as on the Hub, '
        "'huggingface:OWNER/NAME' (e.g. 'huggingface:Salesforce/wikitext'), "
        'with its config in config.data.hf.config.')
  if hf_config is not None and (not isinstance(hf_config, str)
                                or not hf_config):
    raise UsageError('config.data.hf.config must name a config of '
                     f'{repo_id}, got {hf_config!r}.')
  tfds_name = conversion_utils.to_tfds_name(repo_id)
  if hf_config:
    tfds_name += '/' + conversion_utils.to_tfds_name(hf_config)
  return tfds_name, ('hub', repo_id, hf_config or None)


def _disk_splits(hf_path: str) -> tuple[str, tuple[str, ...]]:
  folder = os.path.abspath(os.path.expanduser(hf_path))
  if os.path.isfile(os.path.join(folder, 'dataset_dict.json')):
    with open(os.path.join(folder, 'dataset_dict.json')) as f:
      return folder, tuple(json.load(f)['splits'])
  if os.path.isfile(os.path.join(folder, 'state.json')):
    return folder, ()  # one Dataset: the train split
  raise UsageError(f'config.data.hf.path={hf_path}: not a folder written by '
                   "datasets' save_to_disk (it has no dataset_dict.json or "
                   'state.json).')


def _disk_fingerprint(folder: str, splits: Sequence[str],
                      keys: Sequence[str]) -> str:
  digest = hashlib.sha256(json.dumps(list(keys)).encode())
  for split in splits or ('',):
    directory = os.path.join(folder, split)
    try:
      with open(os.path.join(directory, 'state.json')) as f:
        state = json.load(f)
      sizes = [os.path.getsize(os.path.join(directory, d['filename']))
               for d in state['_data_files']]
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise UsageError(f'{directory}: not a split written by save_to_disk '
                       f'({first_line(e)}).') from None
    digest.update(json.dumps([split, state.get('_fingerprint'),
                              sizes]).encode())
  return digest.hexdigest()[:16]


def _require_datasets(name: str) -> None:
  if importlib.util.find_spec('datasets') is None:
    raise UsageError(f'config.data.name={name!r} is prepared with the '
                     "Hugging Face datasets library, which is not installed: "
                     f'{EXTRA}.')


def is_prepared(tfds_name: str, data_dir: str) -> bool:
  return bool(glob.glob(os.path.join(data_dir, tfds_name, '*',
                                     'dataset_info.json')))


def build(tfds_name: str, hf: tuple, keys: Sequence[str],
          data_dir: str) -> None:
  """Writes the TFDS files of a Hugging Face dataset (``spec_fields``)
  under data_dir, once (see the module doc)."""
  if is_prepared(tfds_name, data_dir):
    return
  made = files.new_folders(data_dir, *tfds_name.split('/'))
  try:
    with files.quiet_tfds():
      _build(tfds_name, hf, keys, data_dir)
  except BaseException:
    files.remove_if_empty(made)  # a refusal leaves no empty folder
    raise


def _build(tfds_name: str, hf: tuple, keys: Sequence[str],
           data_dir: str) -> None:
  kind, source, extra = hf
  name = PREFIX if kind == 'disk' else f'{PREFIX}:{source}'
  _require_datasets(name)
  if kind == 'disk':
    builder = _disk_builder_class()(
        fingerprint=tfds_name.split('/')[1], folder=source, splits=extra,
        keys=tuple(keys), data_dir=data_dir)
    files.quiet(builder).download_and_prepare()
    return
  try:
    builder = _hub_builder_class()(
        hf_repo_id=source, hf_config=extra, data_dir=data_dir,
        file_format='array_record')
  except RuntimeError as e:  # TFDS: 'Failed to load Huggingface dataset ...'
    cause = first_line(e.__cause__ or e)
    where = ('offline, and not in the datasets cache '
             f'{hf_lib.config.HF_DATASETS_CACHE}'
             if hf_lib.config.HF_HUB_OFFLINE
             else 'neither on the Hub nor in the datasets cache')
    raise UsageError(f'config.data.name={name!r}: {source} cannot be read, '
                     f'{where} ({cause}).') from None
  files.quiet(builder).download_and_prepare()


@functools.cache
def _hub_builder_class():
  class HubBuilder(hfb.HuggingfaceDatasetBuilder, skip_registration=True):
    """TFDS's Hugging Face builder, which goes without the Hub's card of
    the dataset (description, licence, gating) when offline or when the Hub
    cannot be reached: the data comes from ``datasets`` (and its cache)."""

    @functools.cached_property
    def _hf_hub_info(self):
      if not hf_lib.config.HF_HUB_OFFLINE:
        try:
          return hfb.HuggingfaceDatasetBuilder._hf_hub_info.func(self)
        except Exception:  # pylint: disable=broad-exception-caught
          pass  # no network, a private mirror, ...
      return types.SimpleNamespace(gated=False, card_data=None, tags=[])

  return HubBuilder


@functools.cache
def _disk_builder_class():
  with tfds.core.registered.skip_registration():
    # Not registered by name: a prepared dataset is read back from its
    # files, which needs neither this class nor the folder it came from.

    class HuggingfaceDisk(tfds.core.GeneratorBasedBuilder):
      """A save_to_disk folder's text columns, one config per fingerprint."""

      VERSION = tfds.core.Version(VERSION)
      RELEASE_NOTES = {str(VERSION): 'A save_to_disk folder.'}

      def __init__(self, *, fingerprint: str, folder: str,
                   splits: Sequence[str], keys: Sequence[str], **kwargs):
        kwargs.setdefault('file_format', 'array_record')
        kwargs['config'] = tfds.core.BuilderConfig(
            name=fingerprint, version=VERSION, release_notes={},
            description=folder)
        self._folder, self._splits = folder, tuple(splits)
        self._keys = tuple(keys)
        super().__init__(**kwargs)

      def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self, description=f'Hugging Face dataset {self._folder}',
            disable_shuffling=True,  # rows in the folder's order
            features=tfds.features.FeaturesDict(
                {k: tfds.features.Text() for k in self._keys}))

      def _split_generators(self, dl_manager):
        del dl_manager
        loaded = hf_lib.load_from_disk(self._folder)
        parts = ({'train': loaded} if isinstance(loaded, hf_lib.Dataset)
                 else dict(loaded))
        return {conversion_utils.to_tfds_name(split):
                    self._generate_examples(split, ds)
                for split, ds in parts.items()}

      def _generate_examples(self, split, ds):
        where = f'{self._folder} (split {split})'
        missing = [k for k in self._keys if k not in ds.column_names]
        if missing:
          raise UsageError(
              f'{where} has no column {missing[0]!r} (it has '
              f'{", ".join(map(repr, ds.column_names[:8]))}); set '
              'config.data.text_key (or direction) to its text column.')
        row = 0
        for batch in ds.select_columns(list(self._keys)).iter(1024):
          for values in zip(*(batch[k] for k in self._keys)):
            for key, value in zip(self._keys, values):
              if not isinstance(value, str):
                raise UsageError(f'{where}, row {row}: {key!r} holds a '
                                 f'{type(value).__name__}, not a string.')
            yield row, dict(zip(self._keys, values))
            row += 1

  return HuggingfaceDisk
