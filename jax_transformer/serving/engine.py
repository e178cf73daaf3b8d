"""Continuous batching: the rows of a KV cache advanced by one jitted
step, requests joining and leaving between steps.

The engine owns the KV cache (a row per request,
:mod:`jax_transformer.serving.programs`) and a thread that runs::

  drop cancelled requests (their rows free at once)
  fit the cache's capacity to the requests held and waiting
  give free rows to waiting requests
  run one prefill chunk of each request still reading its prompt
  advance every row by one token

Requests and answers are token ids: :meth:`Engine.submit` takes a prompt
laid out as the model was trained and a :class:`Params`, and calls back with
one :class:`Event` per token (from the engine's thread). Text, JSON and HTTP
live above it (:mod:`jax_transformer.serving.api`).

The cache holds as many rows as the requests need (its capacity: 1, 2,
4, ... up to ``slots``), so that a step over few requests costs what few
rows cost: it grows when requests wait for a row, and when the requests
held would fit in half of it, they are packed into its first rows and it
shrinks.

The programs are compiled once each, before the engine starts
(:meth:`Engine.compile`): a fresh-prompt prefill per bucket width (powers
of two up to ``chunk``) and the next-chunk prefill of a long prompt; per
capacity, the decode step and its write, the writes of prefilled rows,
moving a row and resizing to each other capacity. Nothing compiles while
serving.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import os
import threading
import time
from typing import Callable

import jax
import numpy as np
from flax import nnx

from jax_transformer.decoding.inputs import place_state, resolve_mesh
from jax_transformer.errors import UsageError
from jax_transformer.serving import programs

# The smallest prefill bucket: shorter prompts are padded to it.
SMALLEST_BUCKET = 16
# The engine's counters (/health shows them).
STATS = ('prefills', 'prefill_tokens', 'prefill_s', 'steps', 'step_rows',
         'step_s', 'resizes', 'resize_s', 'moves')


class Busy(Exception):
  """The queue of waiting requests is full (HTTP 429)."""


class Closed(Exception):
  """The engine takes no new requests: it is stopping (HTTP 503)."""


@dataclasses.dataclass(frozen=True)
class Params:
  """How one request is answered.

  max_tokens: new tokens at most (the stop token counts).
  temperature: 0 is greedy; else sample from softmax(logits / temperature).
  top_p: sample from the nucleus of this probability mass (1: all).
  seed: the sampling seed (None: a random one).
  stop_ids: tokens that end the answer (EOS, a chat's end of turn).
  """
  max_tokens: int
  temperature: float = 0.0
  top_p: float = 1.0
  seed: int | None = None
  stop_ids: frozenset[int] = frozenset()


@dataclasses.dataclass(frozen=True)
class Event:
  """One token of an answer (token None: none came), and on the last event
  why it ended: 'stop' (a stop id, not part of the answer), 'length'
  (max_tokens), or 'cancelled' (the engine stopped)."""
  token: int | None
  finish: str | None = None


@dataclasses.dataclass(eq=False)
class Request:
  """A request inside the engine (its handle for :meth:`Engine.cancel`)."""
  prompt: list[int]
  params: Params
  emit: Callable[[Event], None]
  key: np.ndarray                 # uint32 [2], the sampling key's data
  slot: int | None = None
  read: int = 0                   # prompt tokens prefilled so far
  drawn: int = 0                  # tokens drawn so far
  last: int = 0                   # the last token drawn (fed back next)
  done: bool = False


def buckets(chunk: int) -> tuple[int, ...]:
  """Fresh-prompt widths: powers of two from SMALLEST_BUCKET, then chunk."""
  widths = [w for w in (SMALLEST_BUCKET << i for i in range(16)) if w < chunk]
  return (*widths, chunk)


class Engine:
  """Decode slots over one model; see the module docstring.

  model: a DecoderLM (already cast or quantized as it is to serve).
  slots: rows decoded at once (rounded up to a multiple of the mesh's
    'data' axis).
  max_len: cache slots per row: prompt plus answer, at most.
  chunk: the longest prefill chunk; longer prompts take several.
  queue: requests that may wait for a slot; more are refused (Busy).
  mesh: the mesh the parameters are on (the restore's inference mesh);
    the slots are split over its 'data' axis.
  """

  def __init__(self, model, *, slots: int, max_len: int, chunk: int = 256,
               queue: int = 256, mesh=None):
    config = model.config
    data = 1 if mesh is None else mesh.shape.get('data', 1)
    self.slots = -(-slots // data) * data
    self.rows_per_prefill = data
    self.chunk = min(chunk, max_len)
    # Whole chunks fit: a long prompt's last chunk, padded, stays inside.
    self.cache_len = -(-max_len // self.chunk) * self.chunk
    if config.positional == 'learned' and max_len > config.max_len:
      raise UsageError(f'--max_len {max_len} is past the {config.max_len} '
                       'positions the model learned.')
    self.max_len = max_len
    self.chunked = self.chunk < max_len  # a prompt may take several chunks
    self.buckets = buckets(self.chunk)
    # Cache rows: 1, 2, 4, ... then all of them (multiples of the 'data'
    # axis).
    self.capacities = tuple(sorted({min(data << i, self.slots)
                                    for i in range(self.slots.bit_length() + 1)}))
    self.queue_size = queue
    self.mesh = resolve_mesh(mesh, self.slots)
    graphdef, state = nnx.split(model)
    self._graphdef = graphdef
    self._state = place_state(state, self.mesh)
    self.programs = programs.bind(graphdef, self.mesh)
    self._cache = None
    self._waiting: collections.deque[Request] = collections.deque()
    self._cancelled: list[Request] = []
    self._in_slot: list[Request | None] = [None] * self.slots
    self._wake = threading.Condition()
    self._accepting = True
    self._running = False
    self._thread: threading.Thread | None = None
    self.stats = collections.Counter()  # seconds and counts, for /health
    self._clear_stats()
    self.new_id = itertools.count(1).__next__  # numbers answers' ids

  # ---- the compiled programs ------------------------------------------

  def _call(self, program, *args):
    """program(parameters, *args) on the engine's mesh."""
    return self._call_cache(program, self._state, *args)

  def _call_cache(self, program, *args):
    """program(*args) on the engine's mesh (a program of the cache alone
    takes no parameters)."""
    if self.mesh is None:
      return program(*args)
    with jax.set_mesh(self.mesh):
      return program(*args)

  def _empty_cache(self, rows: int):
    return self._call(functools.partial(self.programs.empty_cache, rows=rows,
                                        length=self.cache_len))

  def _clear_stats(self) -> None:
    """Every counter at 0: /health reads them from another thread while
    the engine counts, so no key may appear later."""
    self.stats.clear()
    self.stats.update(dict.fromkeys(STATS, 0))

  @property
  def capacity(self) -> int:
    """Rows the cache holds now."""
    return self._cache.valid.shape[0]

  @staticmethod
  def _sampling(requests: list[Request]) -> programs.Sampling:
    return programs.Sampling(
        temperature=np.array([r.params.temperature for r in requests],
                             np.float32),
        top_p=np.array([r.params.top_p for r in requests], np.float32),
        keys=np.stack([r.key for r in requests]),
        drawn=np.array([r.drawn for r in requests], np.int32))

  def _prefill(self, group: list[Request], fresh: bool) -> np.ndarray:
    """One prefill call for the requests of group (padded to
    rows_per_prefill by repeating the last): each reads its next chunk.
    Returns the token drawn for each."""
    pieces = [r.prompt[r.read:r.read + self.chunk] for r in group]
    for r, piece in zip(group, pieces):
      r.read += len(piece)
    group = group + group[-1:] * (self.rows_per_prefill - len(group))
    pieces = pieces + pieces[-1:] * (self.rows_per_prefill - len(pieces))
    width = (next(w for w in self.buckets if w >= max(map(len, pieces)))
             if fresh else self.chunk)
    ids = np.zeros((len(group), width), np.int32)
    mask = np.zeros((len(group), width), bool)
    for i, piece in enumerate(pieces):
      ids[i, :len(piece)] = piece
      mask[i, :len(piece)] = True
    rows = np.array([r.slot for r in group], np.int32)
    # Where the chunk's slots start in each row: after the chunks before.
    first = np.array([r.read - len(p) for r, p in zip(group, pieces)],
                     np.int32)
    start = time.perf_counter()
    if fresh:
      tokens, part = self._call(self.programs.prefill_fresh, ids, mask,
                                self._sampling(group))
    else:
      part = self._call_cache(self.programs.take_rows, self._cache, rows)
      tokens, part = self._call(self.programs.prefill_more, part, ids, mask,
                                self._sampling(group))
    self._cache = self._call_cache(
        functools.partial(self.programs.put_rows, width=width), self._cache,
        rows, part, first)
    tokens = np.asarray(tokens)
    self.stats['prefills'] += 1
    self.stats['prefill_tokens'] += int(mask.sum())
    self.stats['prefill_s'] += time.perf_counter() - start
    return tokens

  def _step(self, decoding: list[Request]) -> np.ndarray:
    """One decode step over every row of the cache; rows not in decoding
    (idle, or still reading a prompt) run masked."""
    held = [self._idle] * self.capacity
    for r in decoding:
      held[r.slot] = r
    tokens = np.array([r.last for r in held], np.int32)
    active = np.array([r is not self._idle for r in held])
    start = time.perf_counter()
    out, new = self._call(self.programs.decode_step, self._cache, tokens,
                          active, self._sampling(held))
    self._cache = self._call_cache(self.programs.write_step, self._cache, new)
    out = np.asarray(out)
    self.stats['steps'] += 1
    self.stats['step_rows'] += len(decoding)
    self.stats['step_s'] += time.perf_counter() - start
    return out

  def _resize(self, rows: int) -> None:
    """The cache grown or shrunk to rows (requests past them moved first
    to the lowest free rows)."""
    if rows == self.capacity:
      return
    start = time.perf_counter()
    free = iter(i for i in range(rows) if self._in_slot[i] is None)
    for request in self._in_slot[rows:self.capacity]:
      if request is not None:
        target = next(free)
        self._cache = self._call_cache(self.programs.move_row, self._cache,
                                       np.int32(request.slot),
                                       np.int32(target))
        self._in_slot[target], self._in_slot[request.slot] = request, None
        request.slot = target
        self.stats['moves'] += 1
    self._cache = self._call_cache(
        functools.partial(self.programs.resize, rows=rows), self._cache)
    self.stats['resizes'] += 1
    self.stats['resize_s'] += time.perf_counter() - start

  def _rows_for(self, requests: int) -> int:
    """The least capacity that holds this many requests."""
    return next((c for c in self.capacities if c >= requests), self.slots)

  _idle = Request(prompt=[0], params=Params(max_tokens=1), emit=None,
                  key=np.zeros(2, np.uint32))

  def compile(self) -> tuple[int, float]:
    """Compiles every program once (on scratch caches): returns (count,
    seconds). The engine then serves without compiling."""
    start = time.perf_counter()
    scratch = dataclasses.replace(self._idle, slot=0)
    p = self.rows_per_prefill
    first = np.zeros(p, np.int32)
    sampling = self._sampling([scratch] * p)
    parts = [self._call(self.programs.prefill_fresh,
                        np.zeros((p, w), np.int32), np.ones((p, w), bool),
                        sampling)[1] for w in self.buckets]
    # One empty cache; each capacity's scratch cache after the first is
    # the previous one's resize to it (compiled anyway).
    self._cache = self._empty_cache(self.capacities[0])
    for rows, bigger in zip(self.capacities, self.capacities[1:] + (None,)):
      for width, part in zip(self.buckets, parts):
        self._cache = self._call_cache(
            functools.partial(self.programs.put_rows, width=width),
            self._cache, first, part, first)
      if self.chunked:
        scratch.prompt, scratch.read = [0] * (2 * self.chunk), self.chunk
        self._prefill([scratch], fresh=False)
      self._step([scratch])
      self._cache = self._call_cache(self.programs.move_row, self._cache,
                                     np.int32(0), np.int32(0))
      following = None
      for other in self.capacities:
        if other != rows:
          resized = jax.block_until_ready(self._call_cache(
              functools.partial(self.programs.resize, rows=other),
              self._cache))
          following = resized if other == bigger else following
      self._cache = following
    self._cache = self._empty_cache(self.capacities[0])
    self._clear_stats()
    per_capacity = (3 + len(self.buckets) + 2 * self.chunked
                    + len(self.capacities) - 1)
    return (len(self.buckets) + self.chunked + 1
            + len(self.capacities) * per_capacity,
            time.perf_counter() - start)

  # ---- requests --------------------------------------------------------

  def submit(self, prompt: list[int], params: Params,
             emit: Callable[[Event], None]) -> Request:
    """Queues a prompt (ids laid out as in training; 1 <= its length and
    length + max_tokens <= max_len, checked by the caller). emit(event) is
    called from the engine's thread, once per token. Raises Busy or
    Closed."""
    seed = params.seed
    if seed is None:
      seed = int.from_bytes(os.urandom(4), 'little')
    key = np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32)
    request = Request(list(prompt), params, emit, key)
    with self._wake:
      if not self._accepting:
        raise Closed()
      if len(self._waiting) >= self.queue_size:
        raise Busy()
      self._waiting.append(request)
      self._wake.notify()
    return request

  def cancel(self, request: Request) -> None:
    """Ends a request (its slot frees before the next step); no more events
    are emitted for it."""
    with self._wake:
      if not request.done:
        self._cancelled.append(request)
        self._wake.notify()

  @property
  def steps(self) -> int:
    """Decode steps run since start-up."""
    return self.stats['steps']

  @property
  def accepting(self) -> bool:
    return self._accepting

  @property
  def busy_slots(self) -> int:
    return sum(r is not None for r in self._in_slot)

  @property
  def waiting(self) -> int:
    return len(self._waiting)

  def _finish(self, request: Request, token: int | None, reason: str):
    request.done = True
    if request.slot is not None:
      self._in_slot[request.slot] = None
    request.emit(Event(token, reason))

  def _deliver(self, request: Request, token: int) -> None:
    """A token drawn for request: emitted, and the request ended if it is a
    stop token or its last."""
    request.drawn += 1
    request.last = int(token)
    if token in request.params.stop_ids:
      self._finish(request, None, 'stop')
    elif request.drawn >= request.params.max_tokens:
      self._finish(request, int(token), 'length')
    else:
      request.emit(Event(int(token)))

  # ---- the loop --------------------------------------------------------

  def _take_changes(self) -> list[Request]:
    """Applies cancellations, fits the cache's capacity to the requests
    held and waiting, and hands free rows to waiting requests; returns the
    requests that got one."""
    with self._wake:
      while (self._running and not self._waiting and not self._cancelled
             and not any(self._in_slot)):
        self._wake.wait(timeout=1.0)
      self._apply_cancellations()
      waiting = len(self._waiting)
    self._fit(waiting)
    with self._wake:
      self._apply_cancellations()  # those that came while it resized
      joined = []
      free = (i for i in range(self.capacity) if self._in_slot[i] is None)
      for slot in free:
        if not self._waiting:
          break
        request = self._waiting.popleft()
        request.slot = slot
        self._in_slot[slot] = request
        joined.append(request)
      return joined

  def _apply_cancellations(self) -> None:
    """Ends the cancelled requests and frees their rows (under the lock)."""
    for request in self._cancelled:
      if not request.done:
        request.done = True
        if request in self._waiting:
          self._waiting.remove(request)
        if request.slot is not None:
          self._in_slot[request.slot] = None
    self._cancelled.clear()

  def _fit(self, waiting: int) -> None:
    """Grows the cache to hold the requests held and waiting, or shrinks
    it when they would fit in half of it."""
    held = sum(r is not None for r in self._in_slot)
    rows = self._rows_for(held + waiting)
    if rows > self.capacity or 2 * rows <= self.capacity:
      self._resize(rows)

  def _prefill_round(self) -> None:
    """One chunk of every request still reading its prompt."""
    reading = [r for r in self._in_slot
               if r is not None and r.read < len(r.prompt)]
    fresh = [r for r in reading if r.read == 0]
    more = [r for r in reading if r.read > 0]
    for todo, is_fresh in ((fresh, True), (more, False)):
      size = self.rows_per_prefill
      for group in (todo[i:i + size] for i in range(0, len(todo), size)):
        tokens = self._prefill(group, is_fresh)
        for request, token in zip(group, tokens):
          if request.read == len(request.prompt):
            self._deliver(request, token)

  def _decode_round(self) -> None:
    decoding = [r for r in self._in_slot
                if r is not None and r.read == len(r.prompt) and r.drawn]
    if not decoding:
      return
    tokens = self._step(decoding)
    for request in decoding:
      if not request.done:
        self._deliver(request, tokens[request.slot])

  def _loop(self) -> None:
    while self._running:
      self._take_changes()
      self._prefill_round()
      self._decode_round()

  def start(self) -> None:
    """Starts the engine's thread (compiling first if not yet done)."""
    if self._cache is None:
      self.compile()
    self._running = True
    self._thread = threading.Thread(target=self._loop, name='engine',
                                    daemon=True)
    self._thread.start()

  def close(self) -> None:
    """Takes no new requests (submit raises Closed); those in flight go
    on."""
    with self._wake:
      self._accepting = False

  def stop(self) -> None:
    """Ends every request in flight ('cancelled') and the thread."""
    self.close()
    with self._wake:
      self._running = False
      self._wake.notify()
    if self._thread is not None:
      self._thread.join()
    for request in [*self._waiting, *self._in_slot]:
      if request is not None and not request.done:
        self._finish(request, None, 'cancelled')
    self._waiting.clear()
