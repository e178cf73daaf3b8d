"""TFDS's downloaded datasets (lm1b, WMT), prepared without TensorFlow.

TFDS 4.9 downloads over HTTP with ``requests``, but its extractor writes each
archive member through ``tf.io.gfile``, so ``download_and_extract`` of any
tarball fails when TensorFlow is not installed (lm1b also globs its files with
``tf.io.gfile``). The builders of this package subclass TFDS's ones with
``TfFreeBuilder`` and hand TFDS's own generation code a ``DownloadManager``
that extracts with the standard library.

They keep TFDS's name, version, configs, features, splits, example keys and
download checksums, so they write the dataset TFDS would write, in the same
folder, and ``tfds.data_source(name)`` reads it. They are not entered in
TFDS's registry (the name belongs to TFDS's class); ``builders.builder(name)``
picks them instead of ``tfds.builder(name)``.

Before it downloads a file it does not hold, a builder tries one TCP
connection to the file's host (or the proxy's), 10 s at most, and refuses
in one sentence if there is none: offline, TFDS's downloader would retry
for minutes first. "Downloading and preparing dataset ..." is printed once
the host answers (or nothing needs downloading).
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import os
import shutil
import socket
import tarfile
import urllib.parse
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any, BinaryIO

import tensorflow_datasets as tfds
import tree
from etils import epath
from tensorflow_datasets.core.download import resource as resource_lib

from jax_transformer.errors import UsageError, first_line

ExtractMethod = tfds.download.ExtractMethod
_TAR_METHODS = (ExtractMethod.TAR, ExtractMethod.TAR_GZ,
                ExtractMethod.TAR_STREAM, ExtractMethod.TAR_GZ_STREAM)

# TF-free builders by TFDS name, filled as their modules are imported.
TF_FREE_BUILDERS: dict[str, type[tfds.core.DatasetBuilder]] = {}


class TfFreeBuilder:
  """Mixin, first base of a subclass of a TFDS builder: same dataset, no TF.

  ``class Wmt14Translate(TfFreeBuilder, wmt14.Wmt14Translate)`` is TFDS's
  builder whose ``_split_generators`` gets a ``DownloadManager`` (below).
  A subclass that overrides ``_split_generators`` wraps the manager itself.
  """

  def __init_subclass__(cls, **kwargs):
    stock = next(b for b in cls.__mro__[1:]
                 if issubclass(b, tfds.core.DatasetBuilder))
    # TFDS's name (hence its data folder), its checksums of the real
    # downloads (found next to code_path) and its README metadata.
    cls.name = stock.name
    cls.code_path = stock.code_path
    # pylint: disable-next=protected-access
    cls.pkg_dir_path = stock._get_pkg_dir_path()
    # Registering the name again would clash with TFDS's class, which stays
    # the one tfds.builder() and tfds.data_source() use to read the files.
    super().__init_subclass__(skip_registration=True, **kwargs)
    TF_FREE_BUILDERS[cls.name] = cls

  def _split_generators(self, dl_manager):
    return super()._split_generators(self.download_manager(dl_manager))

  def download_manager(self, dl_manager) -> DownloadManager:
    """TFDS's manager, extracting without TF and refusing at once what an
    unreachable host would have it retry for minutes."""
    return DownloadManager(dl_manager, announce=self._announce)

  def _log_download_bytes(self) -> None:
    # Said by _announce, once the download's host answers: a refusal
    # (offline) is then one line.
    self._announced = False

  def _announce(self) -> None:
    if getattr(self, '_announced', True) is False:
      self._announced = True
      super()._log_download_bytes()


class DownloadManager:
  """TFDS's download manager, extracting archives without TensorFlow.

  Downloads (and their cache and checksums) stay TFDS's. Extraction follows
  TFDS's extractor: the same folder ``<download_dir>/extracted/<METHOD>.<file>``
  (so an extraction made by either is reused by the other), the same members
  skipped, and a temporary folder renamed when complete.
  """

  def __init__(self, manager: tfds.download.DownloadManager,
               announce=None):
    self._manager = manager
    self._announce = announce or (lambda: None)

  def __getattr__(self, name: str) -> Any:
    # manual_dir, download_dir, downloaded_size, ...: TFDS's own.
    return getattr(self._manager, name)

  def download(self, url_or_urls):
    tree.map_structure(_check_downloadable, url_or_urls)
    hosts_checked: set[str] = set()
    for url in tree.flatten(url_or_urls):
      url = url.url if isinstance(url, tfds.download.Resource) else str(url)
      if not is_cached(self._manager, url):
        check_reachable(url, hosts_checked)
    self._announce()
    return self._manager.download(url_or_urls)

  def extract(self, path_or_paths):
    return tree.map_structure(self._extract, path_or_paths)

  def download_and_extract(self, url_or_urls):
    return self.extract(self.download(url_or_urls))

  def iter_archive(self, resource) -> Iterator[tuple[str, BinaryIO]]:
    resource = _as_resource(resource)
    return archive_members(resource.path, resource.extract_method)

  def _extract(self, resource) -> epath.Path:
    resource = _as_resource(resource)
    method = resource.extract_method
    if method == ExtractMethod.NO_EXTRACT:
      return resource.path
    to_path = (epath.Path(self._manager.download_dir) / 'extracted'
               / f'{method.name}.{resource.path.name}')
    if not to_path.exists():
      extract_archive(resource.path, method, to_path)
    return to_path


def is_cached(manager: tfds.download.DownloadManager, url: str) -> bool:
  """Whether TFDS's manager holds url's file already (in its download
  folder, or its manual folder), so that it will not download it; as
  its ``_download_or_get_cache`` decides (False where that cannot be
  told: the host is then tried)."""
  # pylint: disable=protected-access
  try:
    if getattr(manager, '_force_download', False):
      return False
    resource = tfds.download.Resource(url=url)
    if manager._get_manually_downloaded_path(manager._url_infos.get(url)):
      return True
    return any(
        manager._get_checksum_dl_result(resource, legacy_mode=legacy)
        or resource_lib.is_locally_cached(
            manager._get_dl_path(resource, legacy_mode=legacy))
        for legacy in (False, True))
  except Exception:  # pylint: disable=broad-except
    return False


def check_reachable(url: str, checked: set[str] | None = None,
                    timeout: float = 10.0) -> None:
  """Refuses in one sentence a URL whose host (or proxy) takes no TCP
  connection within timeout seconds; checked: hosts already tried."""
  parts = urllib.parse.urlsplit(url)
  if parts.scheme not in ('http', 'https') or not parts.hostname:
    return
  host = parts.hostname
  port = parts.port or (443 if parts.scheme == 'https' else 80)
  proxy = urllib.request.getproxies().get(parts.scheme)
  if proxy and not urllib.request.proxy_bypass(host):
    proxied = urllib.parse.urlsplit(proxy if '://' in proxy
                                    else f'http://{proxy}')
    host, port = proxied.hostname or host, proxied.port or 80
  if checked is not None:
    if host in checked:
      return
    checked.add(host)
  try:
    socket.create_connection((host, port), timeout=timeout).close()
  except OSError as e:
    raise UsageError(
        f'Cannot download {url}: {host}:{port} cannot be reached from this '
        f'machine ({first_line(e) or e.__class__.__name__}); prepare the '
        'dataset on a machine online (python scripts/prepare_data.py with '
        'the same --config) and copy its data_dir here.') from None


def _as_resource(resource) -> tfds.download.Resource:
  if isinstance(resource, tfds.download.Resource):
    return resource
  return tfds.download.Resource(path=resource)


def _check_downloadable(url) -> None:
  """Fails, before this call downloads anything, on what only TF fetches."""
  url = url.url if isinstance(url, tfds.download.Resource) else str(url)
  if (not url.startswith(('http://', 'https://'))
      and importlib.util.find_spec('tensorflow') is None):
    raise RuntimeError(
        f'TFDS fetches {url} with tf.io.gfile, and the package tensorflow is '
        'not installed: choose a dataset config without this source.')


def extract_archive(archive: epath.PathLike, method: ExtractMethod,
                    to_path: epath.PathLike) -> epath.Path:
  """Extracts archive to to_path (a folder; a file for gzip and bzip2)."""
  to_path = epath.Path(to_path)
  to_path.parent.mkdir(parents=True, exist_ok=True)
  # A crash mid-way must not leave a folder that looks complete.
  prefix = tfds.core.constants.INCOMPLETE_PREFIX
  tmp = to_path.parent / f'{prefix}{uuid.uuid4().hex}_{to_path.name}'
  try:
    for name, member in archive_members(archive, method):
      dst = tmp / name if name else tmp
      dst.parent.mkdir(parents=True, exist_ok=True)
      with dst.open('wb') as out:
        shutil.copyfileobj(member, out)
    if not to_path.exists():  # another process may have finished first
      tmp.rename(to_path)
  finally:
    if tmp.is_dir():
      tmp.rmtree()
    elif tmp.exists():
      tmp.unlink()
  return to_path


def archive_members(archive: epath.PathLike, method: ExtractMethod
                    ) -> Iterator[tuple[str, BinaryIO]]:
  """(relative path, readable file) of each member, as TFDS's extractor.

  Gzip and bzip2 hold one file, whose path is ''.
  """
  with epath.Path(archive).open('rb') as f:
    if method in _TAR_METHODS:
      yield from _tar_members(f)
    elif method == ExtractMethod.ZIP:
      yield from _zip_members(f)
    elif method == ExtractMethod.GZIP:
      yield '', gzip.GzipFile(fileobj=f)
    elif method == ExtractMethod.BZIP2:
      yield '', bz2.BZ2File(f)
    else:
      raise ValueError(f'Cannot extract {archive} with {method}.')


def _tar_members(f: BinaryIO) -> Iterator[tuple[str, BinaryIO]]:
  with tarfile.open(fileobj=f, mode='r:*') as tar:
    for member in tar:
      try:
        # Regular files, and links to them; directories give None.
        content = tar.extractfile(member)
      except KeyError:  # a link to a member that is not there
        continue
      name = _safe_name(member.name)
      if content is not None and name:
        yield name, content


def _zip_members(f: BinaryIO) -> Iterator[tuple[str, BinaryIO]]:
  with zipfile.ZipFile(f) as z:
    for info in z.infolist():
      name = _safe_name(info.filename)
      if not info.is_dir() and name:
        with z.open(info) as content:
          yield name, content


def _safe_name(name: str) -> str | None:
  """The member's relative path, or None for what TFDS skips.

  Absolute and parent paths would write outside the folder; hidden files
  (macOS ``._*`` forks) and backups would match the builders' globs.
  """
  name = os.path.normpath(name)
  if (name.startswith('.') or os.path.isabs(name) or name.endswith('~')
      or os.path.basename(name).startswith('.')):
    return None
  return name
