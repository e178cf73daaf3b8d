"""What a run's data was, recorded in its workdir: ``WORKDIR/data.json``.

Written by the trainer at every start (process 0, beside config.json:
``train.checkpoint.save_side_files``) and read by

* the trainer, at a resume: a run of your files (``data.name='files'``)
  whose files changed since it started (one added, removed or rewritten
  under ``data.files.train`` or ``data.files.eval``) is refused in one line
  naming what changed, unless ``data.accept_changed_corpus`` says to go on
  with the new corpus, whose batches then start afresh (``change``);
* inference (``workdirs/restore.py``): evaluate, generate and export read
  the prepared dataset the run trained on by the name recorded here
  (``your_files/<fingerprint>``, ``huggingface_disk/<fingerprint>``), so
  they need neither the training corpus nor the directory training ran in
  (``for_inference``); where that prepared dataset is gone too, evaluating
  says so in one sentence (``gone``).

The record::

  {"kind": "files", "name": "your_files/<fingerprint>",
   "data_dir": "/abs/tensorflow_datasets",
   "files": {"train_files": {"/abs/corpus/a.txt": [size, mtime], ...},
             "eval_files": {...}}}

(``files`` for your files alone). A mixture records its own dataset
(``data.name``); its other sources are not recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from etils import epath

from jax_transformer.data import hf_datasets, sources
from jax_transformer.experiment.data import DataConfig

DATA_FILE = 'data.json'
# Kinds whose dataset is named by a fingerprint of what they were made
# from, read back by that name at inference (sources.Tfds).
FINGERPRINTED = ('files', 'huggingface')
# The record's keys (as older records have them) and the config.data
# field each came from.
FIELDS = {'train_files': 'files.train', 'eval_files': 'files.eval'}
SHOWN = 3  # files named per kind of change


def record(data_cfg: Any) -> dict[str, Any]:
  """The record of a run's data config (its own dataset, not a mixture's
  other sources): globs its files and reads their sizes and times, but
  reads no file."""
  d = DataConfig.of(data_cfg).replace(mixture=None)
  source = sources.source_for(d)
  spec = source.spec
  out: dict[str, Any] = {'kind': source.kind, 'name': spec.name,
                         'data_dir': os.path.abspath(source.data_dir)}
  if source.kind == 'files':
    train, evaluation, _ = spec.files
    out['files'] = {'train_files': _stats(train),
                    'eval_files': _stats(evaluation)}
  return out


def _stats(paths) -> dict[str, list]:
  out = {}
  for path in paths:
    stat = epath.Path(path).stat()
    out[path] = [stat.length, stat.mtime]
  return out


def path_in(root) -> epath.Path:
  """Where a workdir (its root, local or remote) keeps the record."""
  return epath.Path(root) / DATA_FILE


def read(root) -> dict[str, Any] | None:
  """The record in a workdir, or None where it has none (a workdir of a
  version before it, or one written by import_params)."""
  path = path_in(root)
  if not path.exists():
    return None
  try:
    out = json.loads(path.read_text())
  except ValueError:
    return None
  return out if isinstance(out, dict) else None


def change(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
  """None where a resume reads the files the run started with, else what
  changed, e.g. 'config.data.files.train now matches 4 files (3 when this
  run started; added: c.txt)'."""
  if not old or 'files' not in old or 'files' not in new:
    return None
  for field, name in FIELDS.items():
    before = old['files'].get(field) or {}
    now = new['files'].get(field) or {}
    if before == now:
      continue
    added = sorted(set(now) - set(before))
    removed = sorted(set(before) - set(now))
    rewritten = sorted(p for p in set(now) & set(before)
                       if list(now[p]) != list(before[p]))
    names = _short([*before, *now])
    said = [f'{what}: {_listed([names[p] for p in paths])}'
            for what, paths in (('added', added), ('removed', removed),
                                ('changed', rewritten)) if paths]
    return (f'config.data.{name} now matches {_files(len(now))} '
            f'({len(before)} when this run started; {"; ".join(said)})')
  return None


def _files(n: int) -> str:
  return f'{n} file{"" if n == 1 else "s"}'


def _listed(names: list[str]) -> str:
  shown = ', '.join(names[:SHOWN])
  more = len(names) - SHOWN
  return shown + (f' and {more} more' if more > 0 else '')


def _short(paths: list[str]) -> dict[str, str]:
  """Each path relative to the folder all of them share."""
  local = [p for p in paths if '://' not in p]
  if len(set(local)) < 2:
    return {p: os.path.basename(p) for p in paths}
  common = os.path.commonpath([os.path.dirname(p) for p in local])
  return {p: (os.path.relpath(p, common) if '://' not in p else p)
          for p in paths}


def for_inference(data_cfg: Any, rec: dict[str, Any] | None) -> DataConfig:
  """The data config inference reads: for your files (or a save_to_disk
  folder), the prepared dataset the record names, read as any prepared
  TFDS dataset from the recorded data_dir, so that neither the files nor
  the directory training ran in are needed; else the config itself."""
  d = DataConfig.of(data_cfg)
  if not rec or rec.get('kind') not in FINGERPRINTED:
    return d
  if rec['kind'] == 'huggingface' and d.name != hf_datasets.PREFIX:
    return d  # a dataset of the Hub: named without a fingerprint
  return d.replace(name=rec['name'],
                   files=dataclasses.replace(d.files, train=None, eval=None),
                   hf=dataclasses.replace(d.hf, path=None),
                   data_dir=d.data_dir or rec['data_dir'])


def gone(rec: dict[str, Any] | None, split: str, workdir: str
         ) -> str | None:
  """One sentence where the prepared dataset a record names (your files,
  a save_to_disk folder) is no longer under its data_dir, else None."""
  if not rec or rec.get('kind') not in FINGERPRINTED:
    return None
  folder = os.path.join(rec['data_dir'], rec['name'])
  if os.path.isdir(folder):
    return None
  made = ('its files' if rec['kind'] == 'files'
          else 'its save_to_disk folder')
  return (f'{workdir} was trained on {made}, prepared as {rec["name"]} '
          f'under {rec["data_dir"]}, which no longer holds it, so its '
          f'{split} split cannot be scored (evaluation reads the prepared '
          'split, never the corpus): copy that folder back, or prepare the '
          'same corpus again with scripts/prepare_data.py and the run\'s '
          '--config flags.')


__all__ = ['DATA_FILE', 'change', 'for_inference', 'gone', 'path_in', 'read',
           'record']
