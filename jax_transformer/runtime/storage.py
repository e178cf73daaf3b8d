"""Where a run's files live: a local path or object storage, one path type.

Workdir I/O goes through ``etils.epath``, the path type Orbax (checkpoints)
and TFDS already use, so ``--workdir gs://bucket/run`` keeps config.json,
tokenizer/, metrics.jsonl and the checkpoints in the bucket. Object storage
needs its packages (for gs://: gcsfs or TensorFlow, and
google-cloud-storage); without them a run is refused in one sentence before
any work, never written to a local folder named ``gs:``.

What a command writes appears whole or not at all (:func:`written_whole`):
a local folder is written under a temporary name and moved into place at
the end; in object storage, where a rename is a copy, it is written in
place and what was written is removed if the command fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import uuid
from typing import Iterable, Iterator

from absl import logging
from etils import epath

from jax_transformer.errors import UsageError
from jax_transformer.runtime import buckets

# Object storage a run can live in, with what reaches it: epath's fsspec
# filesystem (or TensorFlow's gfile, where installed) and the client Orbax
# asks about buckets; as (fsspec protocol, {module: pip package}). Orbax
# writes arrays to other schemes (s3://) as if they were local paths.
REMOTE_SCHEMES = {
    'gs': ('gcs', {'gcsfs': 'gcsfs',
                   'google.cloud.storage': 'google-cloud-storage'}),
}


def scheme(location: str | os.PathLike) -> str | None:
  """'gs' for 'gs://bucket/run'; None for a local path."""
  text = os.fspath(location)
  return text.split('://', 1)[0] if '://' in text else None


def is_remote(location: str | os.PathLike) -> bool:
  return scheme(location) is not None


def _importable(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # a parent package is missing
    return False


def _missing_packages(kind: str) -> list[str]:
  """The pip packages this machine lacks to keep a run at kind://."""
  protocol, modules = REMOTE_SCHEMES[kind]
  missing = []
  for module, package in modules.items():
    if module == 'gcsfs':  # epath's filesystem: TensorFlow's gfile will do
      if _importable('tensorflow') or _fsspec_knows(protocol):
        continue
    elif _importable(module):
      continue
    missing.append(package)
  return missing


def _fsspec_knows(protocol: str) -> bool:
  import fsspec  # only where a gs:// workdir is asked about
  try:
    fsspec.get_filesystem_class(protocol)
  except (ImportError, ValueError):
    return False
  return True


def check_backend(location: str, flag: str = '--workdir') -> None:
  """Refuses, in one sentence, a location this machine cannot write."""
  kind = scheme(location)
  if kind is None:
    return
  if kind not in REMOTE_SCHEMES:
    raise UsageError(
        f'{flag}={location}: runs can be kept on a local or mounted path or '
        f'in gs://, not {kind}:// (mount it, e.g. with a FUSE driver).')
  missing = _missing_packages(kind)
  if missing:
    raise UsageError(
        f'{flag}={location} needs {" and ".join(missing)} to reach '
        f'{kind}:// (pip install {" ".join(missing)}); nothing was written.')


def check_reachable(location: str | os.PathLike,
                    flag: str = '--workdir') -> None:
  """check_backend, then, for gs://, whether the bucket answers: no
  network, no credentials, no such bucket or no permission is refused in
  one sentence within seconds (``buckets.check``), where the filesystem
  would retry for a minute. What the doors (train.py, the scripts) call
  on the locations they are given, before any other work."""
  check_backend(os.fspath(location), flag)
  if scheme(location) == 'gs':
    buckets.check(location, flag)


def path(location: str | os.PathLike, flag: str = '--workdir') -> epath.Path:
  """location as a path: local ones absolute, remote ones checked."""
  if isinstance(location, epath.Path) and is_remote(location):
    return location
  location = os.fspath(location)
  check_backend(location, flag)
  if is_remote(location):
    return epath.Path(location)
  return epath.Path(os.path.abspath(os.path.expanduser(location)))


def write_atomic(target: epath.Path, data: str | bytes) -> None:
  """target holds data whole, or its old content, whatever kills the
  process: a local file is written beside and renamed; an object store
  already replaces an object in one step."""
  target = epath.Path(target)
  local = not is_remote(target)
  partial = (target.with_name(f'.{target.name}.{uuid.uuid4().hex}.tmp')
             if local else target)
  if isinstance(data, bytes):
    partial.write_bytes(data)
  else:
    partial.write_text(data)
  if local:
    os.replace(partial, target)


def check_writable(workdir: epath.Path, need_bytes: int = 0,
                   who: str = '') -> None:
  """Refuses a workdir this process cannot write, or (local disks) whose
  free space is below need_bytes (about one checkpoint), in one sentence.

  who names the process in multi-host runs (e.g. ' on process 3').
  """
  probe = workdir / f'.write-check-{uuid.uuid4().hex}'
  try:
    workdir.mkdir(parents=True, exist_ok=True)
    probe.write_text('ok')
    probe.unlink()
  except OSError as err:
    reason = err.strerror or err
    if is_remote(workdir) and isinstance(err, FileNotFoundError):
      # Object storage answers a write into a missing bucket with "not
      # found" and the request's URL.
      bucket = os.fspath(workdir).split('://', 1)[1].split('/', 1)[0]
      reason = f'no bucket {bucket} that this machine can reach'
    raise UsageError(f'Cannot write the workdir {workdir}{who} '
                     f'({reason}); choose a writable --workdir.') from None
  if need_bytes and not is_remote(workdir):
    free = shutil.disk_usage(workdir).free
    if free < need_bytes:
      raise UsageError(
          f'The disk holding {workdir}{who} has {free / 2**30:.2f} GiB '
          f'free, less than one checkpoint needs (about '
          f'{need_bytes / 2**30:.2f} GiB); free space or choose another '
          '--workdir.')


def names(folder: str | os.PathLike) -> list[str] | None:
  """The names in folder, or None where there is no such folder; a file
  of that name is refused in one sentence."""
  folder = epath.Path(folder)
  if not folder.exists():
    return None
  if not folder.is_dir():
    raise UsageError(f'{folder} is a file, not a folder; give a folder.')
  return sorted(p.name for p in folder.iterdir())


def remove(folder: str | os.PathLike, entries: Iterable[str],
           folder_too: bool = False) -> None:
  """Removes folder/NAME for each entry (a file, or a folder whole), then
  the folder itself where folder_too and nothing else is in it. Cleaning
  up after a failure: what cannot be removed is logged, never raised over
  the failure being reported."""
  folder = epath.Path(folder)
  for name in entries:
    entry = folder / name
    try:
      if entry.is_dir():
        entry.rmtree()
      elif entry.exists():
        entry.unlink()
    except OSError as err:
      logging.warning('Could not remove %s: %s', entry, err)
  if folder_too:
    try:
      if folder.exists() and not any(folder.iterdir()):
        if is_remote(folder):
          folder.rmtree()  # a folder marker object, if any
        else:
          folder.rmdir()
    except OSError as err:
      logging.warning('Could not remove %s: %s', folder, err)


@contextlib.contextmanager
def written_whole(target: str | os.PathLike) -> Iterator[epath.Path]:
  """Where to write what a command adds to the folder ``target``, so that
  a failure (an exception, Ctrl-C) leaves target as it was.

  Local: a hidden temporary folder, beside target where target does not
  exist yet (renamed to it at the end) and inside it where it does (its
  entries are moved in at the end: a file replaces its namesake, a folder
  is merged into its namesake). If the block raises, the temporary folder
  and any parent folders made for it are removed. A process killed
  outright leaves at most the temporary folder, never a half-written
  target.

  Object storage: target itself, a rename there being a copy of every
  object; if the block raises, what it added to target is removed (target
  too where it was not there before). A file it overwrote stays
  overwritten, so give it a new or empty target.
  """
  target = epath.Path(target)
  before = names(target)
  if is_remote(target):
    try:
      yield target
    except BaseException:
      added = [n for n in (names(target) or []) if n not in (before or [])]
      remove(target, added, folder_too=before is None)
      raise
    return
  made = _missing_folders(target.parent) if before is None else []
  tag = f'partial-{uuid.uuid4().hex[:12]}'
  partial = (target.with_name(f'.{target.name}.{tag}') if before is None
             else target / f'.{tag}')
  partial.mkdir(parents=True)
  try:
    yield partial
    if before is None:
      os.rename(partial, target)
    else:
      _merge(partial, target)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    for folder in made:  # deepest first
      try:
        os.rmdir(folder)
      except OSError:
        break
    raise


def _missing_folders(folder: epath.Path) -> list[str]:
  """folder and its ancestors that do not exist, deepest first."""
  missing = []
  folder = os.path.abspath(os.fspath(folder))
  while not os.path.exists(folder):
    missing.append(folder)
    parent = os.path.dirname(folder)
    if parent == folder:
      break
    folder = parent
  return missing


def _merge(source: epath.Path, target: epath.Path) -> None:
  """Moves source's entries into target (a file replacing its namesake, a
  folder merged into its namesake), then removes source."""
  for entry in sorted(os.listdir(source)):
    src, dst = os.path.join(source, entry), os.path.join(target, entry)
    if os.path.isdir(src) and os.path.isdir(dst):
      _merge(src, dst)
    else:
      os.replace(src, dst)
  os.rmdir(source)
