"""An OpenAI-compatible HTTP API over the engine (FastAPI, run by uvicorn).

  POST /v1/completions        a prompt continued (streamed or whole)
  POST /v1/chat/completions   a conversation answered (the tokenizer's chat
                              template, or the fixed one, as in training)
  GET  /v1/models             the one model served
  GET  /health                200 while serving, 503 once stopping

Every error is an HTTP status with OpenAI's body, ``{"error": {"message",
"type", "param", "code"}}``: 400 for a bad body (unparsable JSON, an unknown
field, a value out of range, a prompt or an answer past the context), 401
for a missing or wrong key, 404 for an unknown model or URL, 413 for a body
over :data:`MOST_BODY_BYTES`, 429 when the queue is full, 503 while
stopping. Text and JSON are handled here; the engine sees token ids only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from jax_transformer.data import chat
from jax_transformer.data.batching import markers
from jax_transformer.decoding import inference
from jax_transformer.errors import UsageError
from jax_transformer.serving import requests as bodies
from jax_transformer.serving.engine import Busy, Closed, Engine, Params
from jax_transformer.serving.text import AnswerText

# Completions' default answer length (OpenAI's).
DEFAULT_MAX_TOKENS = 16
MOST_BODY_BYTES = 8 << 20
# How often a waiting non-streamed request checks that its client is there.
DISCONNECT_POLL_S = 0.25


class ApiError(Exception):
  """An HTTP error with OpenAI's error body."""

  def __init__(self, status: int, message: str, *, param: str | None = None,
               code: str | None = None, kind: str = 'invalid_request_error'):
    super().__init__(message)
    self.status, self.message = status, message
    self.param, self.code, self.kind = param, code, kind

  def response(self) -> JSONResponse:
    return JSONResponse(
        {'error': {'message': self.message, 'type': self.kind,
                   'param': self.param, 'code': self.code}},
        status_code=self.status)


@dataclasses.dataclass
class Served:
  """What the API answers with."""
  engine: Engine
  tokenizer: Any
  model: Any           # for how a prompt is laid out (inference.layout)
  name: str            # the model id clients send
  stream: bool = False  # the LM was trained on a token stream (no BOS)
  api_key: str | None = None
  created: int = dataclasses.field(default_factory=lambda: int(time.time()))

  @property
  def max_len(self) -> int:
    return self.engine.max_len

  @property
  def eos_id(self) -> int:
    return markers(self.tokenizer)[1]


# ---- prompts and parameters ------------------------------------------------


def _prompt_ids(served: Served, prompt: str | list[int]) -> list[int]:
  """A text laid out as in training, or token ids as given."""
  if isinstance(prompt, str):
    ids = inference.layout(list(served.tokenizer.encode(prompt)),
                           served.model, served.stream, served.tokenizer)
  else:
    vocab = served.model.config.vocab_size
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
      raise ApiError(400, f'Token id {bad} is outside the vocabulary '
                     f'(0 to {vocab - 1}).', param='prompt')
    ids = list(prompt)
  if not ids:
    raise ApiError(400, 'The prompt is empty; give some text.',
                   param='prompt')
  return ids


def _params(served: Served, body: bodies.Sampling, prompt_len: int,
            asked: int | None, default: int | None, stop_ids=()) -> Params:
  """The engine's Params for one prompt, its length checked against the
  context."""
  room = served.max_len - prompt_len
  if room < 1:
    raise ApiError(400, f"This model's maximum context length is "
                   f'{served.max_len} tokens. However, your prompt is '
                   f'{prompt_len} tokens, leaving no room for an answer. '
                   'Please shorten it.', param='messages' if default is None
                   else 'prompt', code='context_length_exceeded')
  most = asked if asked is not None else min(default or room, room)
  if most > room:
    raise ApiError(400, f"This model's maximum context length is "
                   f'{served.max_len} tokens. However, you requested '
                   f'{prompt_len + most} tokens ({prompt_len} in the prompt, '
                   f'{most} for the answer). Please reduce the prompt or '
                   'max_tokens.', param='max_tokens',
                   code='context_length_exceeded')
  stops = set(stop_ids) | ({served.eos_id} if not body.ignore_eos else set())
  seed = None if body.seed is None else body.seed % 2 ** 32
  return Params(max_tokens=most, temperature=body.temperature,
                top_p=body.top_p, seed=seed, stop_ids=frozenset(stops))


# ---- answers ---------------------------------------------------------------


class Answer:
  """One prompt in the engine: its text as it comes, then why it ended."""

  def __init__(self, served: Served, ids: list[int], params: Params,
               stops: list[str]):
    self._engine = served.engine
    self._events: asyncio.Queue = asyncio.Queue()
    self._text = AnswerText(served.tokenizer, stops)
    self.prompt_tokens, self.completion_tokens = len(ids), 0
    self.finish: str | None = None
    loop = asyncio.get_running_loop()

    def emit(event):
      try:
        loop.call_soon_threadsafe(self._events.put_nowait, event)
      except RuntimeError:  # the event loop is gone: nobody waits
        pass

    try:
      self._request = self._engine.submit(ids, params, emit)
    except Busy:
      raise ApiError(429, 'Too many requests are waiting; try again '
                     'shortly.', kind='rate_limit_error',
                     code='rate_limit_exceeded') from None
    except Closed:
      raise ApiError(503, 'The server is shutting down.',
                     kind='server_error') from None

  def cancel(self) -> None:
    self._engine.cancel(self._request)

  async def pieces(self) -> AsyncIterator[str]:
    """The answer's text, piece by piece; finish is set at the end."""
    try:
      while self.finish is None:
        event = await self._events.get()
        if event.token is not None:
          self.completion_tokens += 1
          piece = self._text.add(event.token)
          if self._text.stopped:
            self.cancel()
            self.finish = 'stop'
          if piece:
            yield piece
        if event.finish is not None and self.finish is None:
          # A stop token is drawn but is not part of the text.
          self.completion_tokens += event.finish == 'stop'
          self.finish = 'stop' if event.finish == 'stop' else 'length'
          tail = self._text.finish()
          if tail:
            yield tail
    finally:
      if self.finish is None:
        self.cancel()

  async def whole(self) -> str:
    return ''.join([piece async for piece in self.pieces()])

  @property
  def usage(self) -> dict[str, int]:
    return {'prompt_tokens': self.prompt_tokens,
            'completion_tokens': self.completion_tokens,
            'total_tokens': self.prompt_tokens + self.completion_tokens}


def _start_all(served: Served, prompts, params, stops) -> list[Answer]:
  """Every prompt in the engine, or none (a refusal cancels the rest)."""
  answers: list[Answer] = []
  try:
    for ids, p in zip(prompts, params):
      answers.append(Answer(served, ids, p, stops))
  except ApiError:
    for answer in answers:
      answer.cancel()
    raise
  return answers


async def _unless_disconnected(request: Request, work):
  """work's result, or None (work cancelled) once the client has gone."""
  task = asyncio.ensure_future(work)
  while not task.done():
    await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
    if not task.done() and await request.is_disconnected():
      task.cancel()
      return None
  return task.result()


def _usage(answers: list[Answer]) -> dict[str, int]:
  return {key: sum(a.usage[key] for a in answers)
          for key in ('prompt_tokens', 'completion_tokens', 'total_tokens')}


def _events(chunks: AsyncIterator[dict]) -> StreamingResponse:
  """Server-sent events: each chunk as ``data: JSON``, then [DONE]."""

  async def lines():
    async for chunk in chunks:
      yield f'data: {json.dumps(chunk, ensure_ascii=False)}\n\n'
    yield 'data: [DONE]\n\n'

  return StreamingResponse(lines(), media_type='text/event-stream')


# ---- the app ---------------------------------------------------------------


def _validation_error(error: RequestValidationError) -> ApiError:
  first = error.errors()[0]
  where = [str(x) for x in first.get('loc', ()) if x != 'body']
  param = '.'.join(where) or None
  kind = first.get('type', '')
  if kind == 'json_invalid':
    return ApiError(400, 'We could not parse the JSON body of your request: '
                    f"{first.get('ctx', {}).get('error', 'invalid JSON')}.")
  if kind == 'extra_forbidden':
    return ApiError(400, f'Unrecognized request argument supplied: {param}',
                    param=param)
  if kind == 'missing':
    return ApiError(400, f"Missing required parameter: '{param}'.",
                    param=param)
  return ApiError(400, f"Invalid value for '{param}': {first.get('msg')}.",
                  param=param, code='invalid_value')


def create_app(served: Served) -> FastAPI:
  """The ASGI app answering for served (its engine already started)."""
  app = FastAPI(title='jax_transformer', docs_url=None, redoc_url=None,
                openapi_url=None)

  @app.exception_handler(ApiError)
  async def _api_error(request, error: ApiError):
    return error.response()

  @app.exception_handler(RequestValidationError)
  async def _bad_body(request, error: RequestValidationError):
    return _validation_error(error).response()

  @app.exception_handler(HTTPException)
  async def _http_error(request, error: HTTPException):
    message = (f'Unknown request URL: {request.method} {request.url.path}.'
               if error.status_code == 404 else str(error.detail))
    return ApiError(error.status_code, message,
                    code='unknown_url' if error.status_code == 404 else None
                    ).response()

  @app.exception_handler(Exception)
  async def _crash(request, error: Exception):
    return ApiError(500, 'The server had an error while processing your '
                    f'request ({error.__class__.__name__}).',
                    kind='server_error').response()

  @app.middleware('http')
  async def _gate(request: Request, call_next):
    size = request.headers.get('content-length')
    if size is not None and size.isdigit() and int(size) > MOST_BODY_BYTES:
      return ApiError(413, f'The request body is {int(size)} bytes, more '
                      f'than the {MOST_BODY_BYTES} this server takes.'
                      ).response()
    if served.api_key and request.url.path.startswith('/v1/'):
      if request.headers.get('authorization') != f'Bearer {served.api_key}':
        return ApiError(401, 'Incorrect API key provided; send it as '
                        "'Authorization: Bearer KEY'.",
                        code='invalid_api_key').response()
    return await call_next(request)

  def check_model(name: str) -> None:
    if name != served.name:
      raise ApiError(404, f'The model `{name}` does not exist; this server '
                     f'serves `{served.name}`.', param='model',
                     code='model_not_found')

  @app.get('/health')
  async def health():
    engine = served.engine
    if not engine.accepting:
      raise ApiError(503, 'The server is shutting down.',
                     kind='server_error')
    return {'status': 'ok', 'slots': engine.slots,
            'busy_slots': engine.busy_slots, 'waiting': engine.waiting,
            'steps': engine.steps,
            'engine': {k: round(v, 3) for k, v in engine.stats.items()}}

  @app.get('/v1/models')
  async def models():
    return {'object': 'list',
            'data': [{'id': served.name, 'object': 'model',
                      'created': served.created, 'owned_by': 'jax_transformer',
                      'max_model_len': served.max_len}]}

  @app.post('/v1/completions')
  async def completions(body: bodies.Completion, request: Request):
    check_model(body.model)
    if len(body.prompts) > served.engine.queue_size:
      raise ApiError(400, f'{len(body.prompts)} prompts in one request; at '
                     f'most {served.engine.queue_size} (the queue) are '
                     'taken.', param='prompt')
    prompts = [_prompt_ids(served, p) for p in body.prompts]
    params = [_params(served, body, len(ids), body.max_tokens,
                      DEFAULT_MAX_TOKENS) for ids in prompts]
    if body.stream and len(prompts) > 1:
      raise ApiError(400, 'A streamed completion takes one prompt.',
                     param='prompt')
    head = {'id': f'cmpl-{served.engine.new_id()}',
            'object': 'text_completion', 'created': int(time.time()),
            'model': served.name}
    answers = _start_all(served, prompts, params, body.stops)
    if body.stream:
      return _events(_completion_chunks(head, answers[0], body))
    texts = await _unless_disconnected(
        request, asyncio.gather(*(a.whole() for a in answers)))
    if texts is None:
      return JSONResponse({}, status_code=499)
    choices = [{'index': i, 'text': text, 'logprobs': None,
                'finish_reason': a.finish}
               for i, (text, a) in enumerate(zip(texts, answers))]
    return {**head, 'choices': choices, 'usage': _usage(answers)}

  @app.post('/v1/chat/completions')
  async def chat_completions(body: bodies.ChatCompletion, request: Request):
    check_model(body.model)
    try:
      ids = chat.prompt_ids(served.tokenizer, body.conversation)
    except UsageError as e:
      raise ApiError(400, str(e), param='messages') from None
    turn_ends = chat.end_of_turn_ids(served.tokenizer)
    params = _params(served, body, len(ids), body.most_tokens, None,
                     turn_ends)
    head = {'id': f'chatcmpl-{served.engine.new_id()}',
            'object': 'chat.completion', 'created': int(time.time()),
            'model': served.name}
    answer = _start_all(served, [ids], [params], body.stops)[0]
    if body.stream:
      return _events(_chat_chunks(head, answer, body))
    text = await _unless_disconnected(request, answer.whole())
    if text is None:
      return JSONResponse({}, status_code=499)
    return {**head, 'choices': [{
        'index': 0, 'message': {'role': 'assistant', 'content': text},
        'logprobs': None, 'finish_reason': answer.finish}],
            'usage': answer.usage}

  return app


async def _completion_chunks(head: dict, answer: Answer,
                             body: bodies.Completion) -> AsyncIterator[dict]:
  def chunk(text, finish=None):
    return {**head, 'choices': [{'index': 0, 'text': text, 'logprobs': None,
                                 'finish_reason': finish}]}

  async for piece in answer.pieces():
    yield chunk(piece)
  yield chunk('', answer.finish)
  if body.include_usage:
    yield {**head, 'choices': [], 'usage': answer.usage}


async def _chat_chunks(head: dict, answer: Answer,
                       body: bodies.ChatCompletion) -> AsyncIterator[dict]:
  head = {**head, 'object': 'chat.completion.chunk'}

  def chunk(delta, finish=None):
    return {**head, 'choices': [{'index': 0, 'delta': delta,
                                 'logprobs': None, 'finish_reason': finish}]}

  yield chunk({'role': 'assistant', 'content': ''})
  async for piece in answer.pieces():
    yield chunk({'content': piece})
  yield chunk({}, answer.finish)
  if body.include_usage:
    yield {**head, 'choices': [], 'usage': answer.usage}
