"""scripts/serve.py as users run it, driven by the official openai client
and by plain HTTP: the answers are generate.py's, 32 clients are served at
once, and every bad request gets OpenAI's error body while the server goes
on. A tiny random Llama 3 (its tokenizer adds BOS) from a Hugging Face
folder given directly; its parameters spread over the 8 host devices."""

import concurrent.futures
import json

import openai
import pytest
from harness import harness_models
from script_helpers import load_script
from serving.server_process import KEY, Server, events

# One worker builds the module's fixtures once (they are per worker).
pytestmark = pytest.mark.xdist_group('server')

NAME = 'tiny'
PROMPTS = ['To be, or not', 'Ham.', 'Enter the ghost of Banquo, and sits '
           'in Macbeth\'s place. ' * 2]  # the last takes chunks


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  return harness_models.save('llama3', tmp_path_factory.mktemp('served'))


@pytest.fixture(scope='module')
def server(folder):
  server = Server(folder, '--max_slots', '4', '--max_len', '128',
                  '--prefill_chunk', '32', '--max_queue', '64',
                  '--model_name', NAME)
  yield server
  assert server.stop() == 0, server.output()


@pytest.fixture(scope='module')
def client(server):
  return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


def generated(capsys, folder, *flags):
  """What generate.py prints for the same checkpoint (in-process)."""
  capsys.readouterr()
  assert load_script('generate').main(['--workdir', str(folder),
                                       *flags]) == 0
  return capsys.readouterr().out.removesuffix('\n')


def test_it_says_what_it_compiled_before_it_listened(server):
  out = server.output()
  assert 'compiled 31 programs' in out and '4 slots of 128 tokens' in out
  assert out.index('compiled') < out.index('Serving tiny on http://')


@pytest.mark.parametrize('prompt', PROMPTS)
def test_greedy_answers_are_generate_pys_whole_and_streamed(
    client, folder, capsys, prompt):
  expected = generated(capsys, folder, '--input', prompt,
                       '--max_new_tokens', '24')
  whole = client.completions.create(model=NAME, prompt=prompt,
                                    max_tokens=24, temperature=0)
  assert prompt + whole.choices[0].text == expected
  streamed = client.completions.create(
      model=NAME, prompt=prompt, max_tokens=24, temperature=0, stream=True,
      stream_options={'include_usage': True})
  chunks = list(streamed)
  text = ''.join(c.choices[0].text for c in chunks if c.choices)
  assert prompt + text == expected
  assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
  assert whole.usage.total_tokens == (whole.usage.prompt_tokens
                                      + whole.usage.completion_tokens)


def test_a_chat_is_answered_as_generate_py_answers_it(client, folder,
                                                      capsys):
  messages = [{'role': 'user', 'content': 'Who is Banquo?'}]
  expected = generated(capsys, folder, '--chat', json.dumps(messages),
                       '--max_new_tokens', '20')
  answer = client.chat.completions.create(model=NAME, messages=messages,
                                          max_tokens=20, temperature=0)
  assert answer.choices[0].message.content == expected
  assert answer.choices[0].message.role == 'assistant'
  pieces = [c.choices[0].delta.content or '' for c in
            client.chat.completions.create(model=NAME, messages=messages,
                                           max_tokens=20, temperature=0,
                                           stream=True)]
  assert ''.join(pieces) == expected


def test_thirty_two_clients_at_once_are_all_answered(client):
  def ask(i):
    return client.completions.create(
        model=NAME, prompt=PROMPTS[i % 3], max_tokens=12, temperature=0.8,
        seed=i, extra_body={'ignore_eos': True})

  with concurrent.futures.ThreadPoolExecutor(32) as pool:
    answers = list(pool.map(ask, range(32)))
  assert [a.usage.completion_tokens for a in answers] == [12] * 32
  again = ask(5)  # a seed's answer, whatever else was in the batch
  assert again.choices[0].text == answers[5].choices[0].text


def test_stop_strings_end_the_answer_before_them(client):
  free = client.completions.create(model=NAME, prompt=PROMPTS[0],
                                   max_tokens=24, temperature=0)
  text = free.choices[0].text
  stop = text[len(text) // 2:len(text) // 2 + 2]
  cut = client.completions.create(model=NAME, prompt=PROMPTS[0],
                                  max_tokens=24, temperature=0, stop=[stop])
  assert cut.choices[0].text == text[:text.index(stop)]
  assert cut.choices[0].finish_reason == 'stop'


def test_models_and_health(server):
  status, body = server.get('/v1/models')
  assert status == 200 and body['data'][0]['id'] == NAME
  assert body['data'][0]['max_model_len'] == 128
  status, body = server.get('/health')
  assert status == 200 and body['slots'] == 4


LONG = 'word ' * 200
BAD = [  # (body or raw bytes, status, a phrase of the message, param)
    (b'{"model": "tiny", "prompt": ', 400, 'could not parse', None),
    ({'model': NAME, 'prompt': 'x', 'colour': 'red'}, 400,
     'Unrecognized request argument', 'colour'),
    ({'model': 'gpt-9', 'prompt': 'x'}, 404, 'does not exist', 'model'),
    ({'prompt': 'x'}, 400, 'Missing required parameter', 'model'),
    ({'model': NAME, 'prompt': LONG}, 400, 'maximum context length',
     'prompt'),
    ({'model': NAME, 'prompt': 'x', 'max_tokens': 128}, 400,
     'maximum context length', 'max_tokens'),
    ({'model': NAME, 'prompt': 'x', 'max_tokens': 10 ** 12}, 400,
     'maximum context length', 'max_tokens'),
    ({'model': NAME, 'prompt': 'x', 'temperature': -1}, 400,
     'Invalid value', 'temperature'),
    ({'model': NAME, 'prompt': 'x', 'n': 3}, 400, 'Invalid value', 'n'),
    ({'model': NAME, 'prompt': 'x', 'stop': list('abcde')}, 400,
     'at most 4 stop', 'stop'),
    ({'model': NAME, 'prompt': [10 ** 6]}, 400, 'outside the vocabulary',
     'prompt'),
    ({'model': NAME, 'prompt': ['a'] * 100000}, 400, 'at most 64',
     'prompt'),
    ({'model': NAME, 'prompt': 'x' * (9 << 20)}, 413, 'bytes', None),
    ({'model': NAME, 'messages': []}, 400, 'Invalid value', 'messages'),
]


@pytest.mark.parametrize('body,status,phrase,param', BAD)
def test_a_bad_request_gets_its_error_and_the_next_is_served(
    server, body, status, phrase, param):
  raw = body if isinstance(body, bytes) else None
  path = ('/v1/chat/completions' if isinstance(body, dict)
          and 'messages' in body else '/v1/completions')
  got, answer = server.post(path, None if raw else body, raw=raw)
  assert got == status, answer
  error = answer['error']
  assert phrase in error['message'] and error['param'] == param
  assert set(error) == {'message', 'type', 'param', 'code'}
  ok, answer = server.post('/v1/completions', {'model': NAME, 'prompt': 'x',
                                                'max_tokens': 2})
  assert ok == 200 and answer['choices'][0]['finish_reason'] in (
      'length', 'stop')


def test_without_the_key_v1_is_refused_and_health_is_not(server):
  status, answer = server.post('/v1/completions',
                               {'model': NAME, 'prompt': 'x'}, key=None)
  assert status == 401 and answer['error']['code'] == 'invalid_api_key'
  status, _ = server.post('/v1/completions', {'model': NAME, 'prompt': 'x'},
                          key='wrong')
  assert status == 401
  assert server.request('GET', '/health', key=None)[0] == 200


def test_an_unknown_url_is_an_openai_404(server):
  status, answer = server.get('/v1/embeddings')
  assert status == 404 and answer['error']['code'] == 'unknown_url'


def test_a_streamed_answer_is_server_sent_events(server):
  connection, response = server.open_stream('/v1/completions', {
      'model': NAME, 'prompt': 'Ham.', 'max_tokens': 5, 'stream': True,
      'temperature': 0})
  assert response.status == 200
  assert response.getheader('content-type').startswith('text/event-stream')
  chunks = list(events(response))
  connection.close()
  assert chunks[-1]['choices'][0]['finish_reason'] in ('length', 'stop')
  assert all(c['object'] == 'text_completion' for c in chunks)


@pytest.mark.slow
def test_int8_weights_answer_as_generate_py_does(folder, capsys):
  """--int8, as generate.py offers it: the same greedy answer as
  generate.py's with the same flag (and not the float32 answer: the flag
  is in effect). In bfloat16 the two part after a few tokens: they run
  programs of other shapes, whose sums round otherwise."""
  flags = ('--int8',)
  server = Server(folder, '--max_slots', '2', '--max_len', '64',
                  '--model_name', NAME, *flags, key=None)
  try:
    status, answer = server.post('/v1/completions', {
        'model': NAME, 'prompt': PROMPTS[1], 'max_tokens': 40,
        'temperature': 0}, key=None)
    assert status == 200, answer
  finally:
    assert server.stop() == 0, server.output()
  asked = ('--input', PROMPTS[1], '--max_new_tokens', '40')
  text = PROMPTS[1] + answer['choices'][0]['text']
  assert text == generated(capsys, folder, *asked, *flags)
  assert text != generated(capsys, folder, *asked)
