"""serve.py under load and at its end, with one slot and a queue of one: a
full queue answers 429, a client that leaves mid-stream frees its slot,
SIGTERM lets the answer in flight finish and exits 0. Served from a
workdir made by import_params.py."""

import concurrent.futures
import signal
import time

import pytest
from harness import harness_models
from script_helpers import run_script
from serving.server_process import Server, events

LONG = {'model': 'tiny', 'prompt': 'Ham.', 'max_tokens': 120,
        'ignore_eos': True}


@pytest.fixture(scope='module')
def server(tmp_path_factory):
  root = tmp_path_factory.mktemp('load')
  folder = harness_models.save('gpt2', root / 'hf')
  made = run_script('import_params', '--from', folder, '--config',
                    'lm_shakespeare', '--workdir', str(root / 'tiny'))
  assert made.returncode == 0, made.stderr[-3000:]
  server = Server(root / 'tiny', '--max_slots', '1', '--max_queue', '1')
  yield server
  server.stop()


def health(server):
  status, body = server.get('/health')
  assert status == 200, body
  return body


def test_more_requests_than_the_queue_holds_get_429(server):
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    answers = list(pool.map(lambda _: server.post('/v1/completions', LONG),
                            range(8)))
  statuses = [status for status, _ in answers]
  assert 429 in statuses and 200 in statuses, statuses
  for status, body in answers:
    if status == 429:
      assert body['error']['type'] == 'rate_limit_error'
    else:
      assert status == 200 and body['usage']['completion_tokens'] == 120
  assert server.post('/v1/completions', LONG)[0] == 200


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
  before = health(server)['steps']
  connection, response = server.open_stream('/v1/completions',
                                            {**LONG, 'stream': True})
  next(events(response))
  connection.close()
  deadline = time.monotonic() + 30
  while health(server)['busy_slots']:
    assert time.monotonic() < deadline
    time.sleep(0.01)
  # Freed well before its 120 tokens were decoded.
  assert health(server)['steps'] - before < 100
  assert server.post('/v1/completions', {**LONG, 'max_tokens': 3})[0] == 200


def test_sigterm_finishes_the_answer_in_flight_and_exits_0(server):
  connection, response = server.open_stream('/v1/completions',
                                            {**LONG, 'stream': True})
  chunks = events(response)
  first = next(chunks)
  server.proc.send_signal(signal.SIGTERM)
  status, _ = server.post('/v1/completions', LONG)
  assert status in (None, 503)  # refused: no longer listening, or stopping
  rest = list(chunks)
  connection.close()
  assert rest[-1]['choices'][0]['finish_reason'] == 'length'
  text = ''.join(c['choices'][0]['text'] for c in [first, *rest])
  assert text
  assert server.proc.wait(60) == 0, server.output()
  assert 'Stopped.' in server.output()
