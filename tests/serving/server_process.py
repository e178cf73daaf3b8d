"""scripts/serve.py started as a user starts it, and plain HTTP to it."""

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

from repo import ROOT, SCRIPTS
from train_runs import free_port

KEY = 'test-key'


class Server:
  """A serve.py process on 127.0.0.1 (the API key KEY from the
  environment), started and waited for until it answers /health."""

  def __init__(self, workdir: str, *flags: str, timeout: float = 300,
               key: str | None = KEY):
    self.port = free_port()
    self.log = tempfile.TemporaryFile('w+')  # the workdir may be gs://
    env = dict(os.environ, JAX_PLATFORMS='cpu', TPU_SKIP_MDS_QUERY='1')
    env.pop('JAX_TRANSFORMER_API_KEY', None)
    if key:
      env['JAX_TRANSFORMER_API_KEY'] = key
    self.key = key
    self.proc = subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, 'serve.py'), '--workdir',
         str(workdir), '--port', str(self.port), *flags],
        cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        text=True)
    deadline = time.monotonic() + timeout
    while self.get('/health')[0] != 200:
      assert self.proc.poll() is None, self.output()
      assert time.monotonic() < deadline, self.output()
      time.sleep(0.5)

  @property
  def base_url(self) -> str:
    return f'http://127.0.0.1:{self.port}/v1'

  def output(self) -> str:
    self.log.flush()
    self.log.seek(0)
    return self.log.read()

  def _connect(self):
    return http.client.HTTPConnection('127.0.0.1', self.port, timeout=60)

  def request(self, method: str, path: str, body=None, key: str | None = KEY,
              raw: bytes | None = None):
    """(status, parsed JSON body or None)."""
    headers = {'Content-Type': 'application/json'}
    if key:
      headers['Authorization'] = f'Bearer {key}'
    data = raw if raw is not None else (
        None if body is None else json.dumps(body).encode())
    try:
      connection = self._connect()
      connection.request(method, path, body=data, headers=headers)
      response = connection.getresponse()
    except ConnectionError:
      return None, None
    text = response.read()
    connection.close()
    try:
      return response.status, json.loads(text)
    except ValueError:
      return response.status, None

  def get(self, path: str):
    return self.request('GET', path, key=self.key)

  def post(self, path: str, body=None, **kwargs):
    return self.request('POST', path, body, **kwargs)

  def open_stream(self, path: str, body: dict):
    """(connection, response) of a streamed request; read its lines."""
    connection = self._connect()
    connection.request('POST', path, body=json.dumps(body).encode(),
                       headers={'Content-Type': 'application/json',
                                'Authorization': f'Bearer {KEY}'})
    return connection, connection.getresponse()

  def stop(self, timeout: float = 60) -> int:
    if self.proc.poll() is None:
      self.proc.terminate()
    try:
      return self.proc.wait(timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
      self.log.close()


def events(response):
  """The JSON chunks of a server-sent event stream, until [DONE]."""
  for line in response:
    line = line.decode().strip()
    if not line.startswith('data: '):
      continue
    if line == 'data: [DONE]':
      return
    yield json.loads(line[len('data: '):])
