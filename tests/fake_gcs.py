"""A local stand-in for Google Cloud Storage: gs://bucket/key lives at
<root>/bucket/key, reached the ways a real bucket is, so that a run's I/O
through its gs:// workdir can be checked without a network.

epath reaches gs:// through fsspec's 'gcs' filesystem (as with gcsfs), here
a folder-backed one; Orbax writes arrays with TensorStore, whose paths are
mapped to the same folder, and asks google-cloud-storage about buckets,
which is answered as for a flat bucket. Orbax then commits steps as on a
local disk (by renames), which is the part of GCS this does not imitate.
"""

import os
import sys

from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils
from orbax.checkpoint._src.serialization import tensorstore_utils

from jax_transformer.runtime import storage


def install(monkeypatch, root: str) -> None:
  """Routes gs:// to root for the rest of the test (call
  ``forget_filesystems`` after it)."""

  class FolderBucket(DirFileSystem):
    protocol = ('gs', 'gcs')

    def __init__(self, *args, **kwargs):
      del args, kwargs  # gcsfs's options
      super().__init__(path=root, fs=LocalFileSystem())

    @classmethod
    def _strip_protocol(cls, path):
      path = os.fspath(path)
      for prefix in ('gs://', 'gcs://'):
        path = path.removeprefix(prefix)
      return path.rstrip('/')

  def local(path):
    path = os.fspath(path)
    if path.startswith('gs://'):
      return os.path.join(root, path.removeprefix('gs://'))
    return path

  registry = sys.modules['fsspec.registry']._registry
  monkeypatch.setitem(registry, 'gcs', FolderBucket)  # undone after the test
  epath_backend.fsspec_backend._get_filesystem.cache_clear()
  monkeypatch.setattr(storage, '_importable', lambda module: True)
  normalize = tensorstore_utils._normalize_path
  monkeypatch.setattr(tensorstore_utils, '_normalize_path',
                      lambda path: normalize(local(path)))
  monkeypatch.setattr(gcs_utils, 'is_gcs_path', lambda path: False)
  monkeypatch.setattr(gcs_utils, 'is_hierarchical_namespace_enabled',
                      lambda path: False)


def forget_filesystems() -> None:
  """epath caches filesystems: drop the stand-in's after a test."""
  epath_backend.fsspec_backend._get_filesystem.cache_clear()
