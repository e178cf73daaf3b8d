"""Where a run's files live: a local path or object storage, one path type.

Workdir I/O goes through ``etils.epath``, the path type Orbax (checkpoints)
and TFDS already use, so ``--workdir gs://bucket/run`` keeps config.json,
tokenizer/, metrics.jsonl and the checkpoints in the bucket. Object storage
needs its packages (for gs://: gcsfs or TensorFlow, and
google-cloud-storage); without them a run is refused in one sentence before
any work, never written to a local folder named ``gs:``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import uuid

from etils import epath

from jax_transformer.errors import UsageError

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
