"""The continuous-batching engine in-process (jax_transformer/serving):
answers equal decoding.generate's, whatever shares the batch, with no
compile after start-up; and the per-row cache index it stands on."""

import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer import decoding
from jax_transformer.model.attention import write_new
from jax_transformer.model.config import small_lm
from jax_transformer.model.models import DecoderLM
from jax_transformer.serving import programs
from jax_transformer.serving.engine import Busy, Closed, Engine, Params

# One worker builds the module's fixtures once (they are per worker).
pytestmark = pytest.mark.xdist_group('engine')

LENGTHS = (3, 5, 17, 40, 70, 12)  # 40 and 70 take two and three chunks


def tiny_lm(positional: str) -> DecoderLM:
  config = small_lm(vocab_size=97, d_model=32, num_heads=4, d_ff=64,
                    num_decoder_layers=2, max_len=128, positional=positional)
  return DecoderLM(config, nnx.Rngs(0))


@pytest.fixture(scope='module', params=['rotary', 'learned'])
def model(request):
  return tiny_lm(request.param)


@pytest.fixture(scope='module')
def engine(model):
  engine = Engine(model, slots=4, max_len=96, chunk=32, queue=16)
  engine.start()
  yield engine
  engine.stop()


def prompts():
  rng = np.random.default_rng(0)
  return [list(rng.integers(3, 97, size=n)) for n in LENGTHS]


class Collect:
  """An answer's events, waited for."""

  def __init__(self):
    self.tokens, self.finish = [], None
    self.done = threading.Event()

  def __call__(self, event):
    if event.token is not None:
      self.tokens.append(event.token)
    if event.finish is not None:
      self.finish = event.finish
      self.done.set()

  def wait(self):
    assert self.done.wait(120), 'no answer within 120 s'
    return self.tokens


def generated(model, prompt, tokens):
  """decoding.generate's greedy answer to prompt, tokens long."""
  out = decoding.generate(model, np.array([prompt]), max_new_tokens=tokens,
                          eos_id=None)
  return list(np.asarray(out.tokens[0]))


def compiles(engine) -> dict[str, int]:
  """What each of the engine's programs has compiled (a jit cache entry
  per shape)."""
  return {name: program._cache_size() for name, program
          in zip(programs.Programs._fields, engine.programs)}


def ask(engine, prompt, **params):
  answer = Collect()
  engine.submit(prompt, Params(**params), answer)
  return answer


def test_greedy_answers_equal_generate_with_six_sharing_four_slots(
    engine, model):
  answers = [ask(engine, p, max_tokens=20) for p in prompts()]
  for prompt, answer in zip(prompts(), answers):
    assert answer.wait() == generated(model, prompt, 20)
    assert answer.finish == 'length'


def test_answers_moved_to_smaller_caches_equal_generate(engine, model):
  """Four requests take rows 0-3. When the two short ones end, the two
  others (rows 2 and 3) move to rows 0 and 1 and the cache shrinks to two
  rows; when the sampled one ends, the long one moves again and the cache
  shrinks to one row: its greedy answer is generate's and the sampled one
  is the one it draws alone."""
  sampled = dict(max_tokens=12, temperature=0.9, seed=3)
  alone = ask(engine, prompts()[5], **sampled).wait()
  packing = Engine(model, slots=4, max_len=96, chunk=32)
  answers = [ask(packing, p, max_tokens=2) for p in prompts()[:2]]
  answers += [ask(packing, prompts()[5], **sampled),
              ask(packing, prompts()[3], max_tokens=30)]
  packing.start()  # all four waiting: rows 0-3 in order
  try:
    assert [a.wait() for a in answers][2] == alone
    assert answers[3].tokens == generated(model, prompts()[3], 30)
    assert packing.stats['moves'] == 3 and packing.capacity == 1
  finally:
    packing.stop()


@pytest.mark.slow
def test_on_a_mesh_rows_move_and_nothing_compiles_while_serving():
  """Rows split over a 'data' axis of 2 (prefills two rows at a time):
  requests join a growing cache, a long prompt takes chunks, rows move as
  it shrinks; answers equal generate's and no program compiles after
  start-up (every cache a program's output, one sharding)."""
  model = tiny_lm('rotary')
  mesh = jax.make_mesh((2, 4), ('data', 'fsdp'))
  engine = Engine(model, slots=4, max_len=96, chunk=32, mesh=mesh)
  engine.compile()
  compiled = compiles(engine)
  lengths = {0: 4, 1: 3, 3: 30, 4: 9}  # prompt 3 takes two chunks
  answers = {i: ask(engine, prompts()[i], max_tokens=n)
             for i, n in lengths.items()}
  engine.start()
  try:
    for i, answer in answers.items():
      assert answer.wait() == generated(model, prompts()[i], lengths[i])
    later = ask(engine, prompts()[2], max_tokens=5).wait()  # one row again
    assert len(later) == 5 and engine.stats['moves'] >= 1
    assert engine.capacities == (2, 4)
  finally:
    engine.stop()
  assert compiles(engine) == compiled


def test_a_seeded_sample_does_not_depend_on_the_batch(engine):
  prompt = prompts()[2]
  sampling = dict(max_tokens=15, temperature=0.9, top_p=0.8, seed=7)
  alone = ask(engine, prompt, **sampling).wait()
  others = [ask(engine, p, max_tokens=25, temperature=1.0, seed=i)
            for i, p in enumerate(prompts())]
  crowded = ask(engine, prompt, **sampling).wait()
  for other in others:
    other.wait()
  assert crowded == alone
  other_seed = ask(engine, prompt, **{**sampling, 'seed': 8}).wait()
  assert other_seed != alone  # the seed is what decides


def test_a_stop_token_ends_the_answer_before_it(engine, model):
  prompt = prompts()[1]
  free = ask(engine, prompt, max_tokens=20).wait()
  stop = free[5]
  cut = ask(engine, prompt, max_tokens=20, stop_ids=frozenset({stop}))
  assert cut.wait() == free[:free.index(stop)]
  assert cut.finish == 'stop'


def test_nothing_compiles_while_serving(engine):
  compiled = compiles(engine)
  for answer in [ask(engine, p, max_tokens=8, temperature=t, top_p=0.5)
                 for p, t in zip(prompts(), (0.0, 1.0) * 3)]:
    answer.wait()
  assert compiles(engine) == compiled


def test_the_count_it_says_is_the_programs_it_compiled(model):
  # serve.py prints the count.
  for slots, chunk in ((4, 32), (8, 96)):
    engine = Engine(model, slots=slots, max_len=96, chunk=chunk)
    count, _ = engine.compile()
    assert count == sum(compiles(engine).values())


def test_no_program_leaves_an_effect(model):
  """An effect (the model's traced cache-room check leaves one) sends
  every call of a program through JAX's Python dispatch: each program,
  traced with the arguments compile gives it, has none."""
  engine = Engine(model, slots=2, max_len=96, chunk=32)
  effects = {}

  def watched(name, program):
    def run(*args, **kwargs):
      traced = program.trace(*args, **kwargs).jaxpr
      effects.setdefault(name, set()).update(traced.effects)
      return program(*args, **kwargs)
    return run
  engine.programs = programs.Programs(*(
      watched(name, program)
      for name, program in zip(programs.Programs._fields, engine.programs)))
  engine.compile()
  assert effects == {name: set() for name in programs.Programs._fields}


def test_a_cancelled_request_frees_its_slot(model):
  engine = Engine(model, slots=1, max_len=96, chunk=32, queue=1)
  engine.start()
  try:
    long, proceed = Collect(), threading.Event()

    def hold_at_the_first_token(event):
      long(event)
      proceed.wait(60)  # the engine's thread waits here, its slot taken

    request = engine.submit(prompts()[0], Params(max_tokens=90),
                            hold_at_the_first_token)
    while not long.tokens:
      time.sleep(0.01)
    waiting = ask(engine, prompts()[1], max_tokens=3)
    with pytest.raises(Busy):  # one waiting is all the queue holds
      engine.submit(prompts()[2], Params(max_tokens=3), Collect())
    engine.cancel(request)
    proceed.set()
    assert len(waiting.wait()) == 3  # it got the slot
    # At most the step under way when it was cancelled.
    assert len(long.tokens) <= 2 and long.finish is None
  finally:
    proceed.set()
    engine.stop()
  with pytest.raises(Closed):
    engine.submit(prompts()[0], Params(max_tokens=3), Collect())


def test_rows_at_their_own_cache_index_decode_as_each_alone(model):
  """Rows of 4 and 9 tokens: with one index per row, the next token goes
  to slot 4 in the first row and 9 in the second (no padding slot in
  between), and its logits are those of each row decoded alone."""
  rng = np.random.default_rng(1)
  rows = [rng.integers(3, 97, n) for n in (4, 9)]
  ids = jnp.array([np.pad(r, (0, 9 - len(r))) for r in rows], jnp.int32)
  mask = ids != 0
  cache = model.init_cache(2, 16)._replace(index=jnp.zeros(2, jnp.int32))
  _, cache = model.extend(ids, cache, mask)
  cache = cache._replace(index=jnp.array([4, 9], jnp.int32))
  nxt = jnp.array([[5], [6]], jnp.int32)
  together, cache = model.extend(nxt, cache)
  assert cache.index.tolist() == [5, 10]
  assert cache.valid[0, :6].tolist() == [True] * 5 + [False]
  for r, row in enumerate(rows):
    _, alone = model.extend(jnp.array([row]), model.init_cache(1, 16))
    expected, _ = model.extend(nxt[r:r + 1], alone)
    np.testing.assert_allclose(together[r], expected[0], rtol=2e-6,
                               atol=2e-6)


def _stepped_rows(model, lengths=(4, 9, 6)):
  """A cache of a row per length at its own index, the tokens that come
  next, and which rows hold a request (the third runs masked)."""
  rng = np.random.default_rng(2)
  rows = [rng.integers(3, 97, n) for n in lengths]
  ids = jnp.array([np.pad(r, (0, 9 - len(r))) for r in rows], jnp.int32)
  cache = model.init_cache(len(rows), 16)._replace(
      index=jnp.zeros(len(rows), jnp.int32))
  _, cache = model.extend(ids, cache, ids != 0)
  cache = cache._replace(index=jnp.array(lengths, jnp.int32))
  nxt = jnp.arange(5, 5 + len(rows), dtype=jnp.int32)[:, None]
  return cache, nxt, (jnp.arange(len(rows)) != 2)[:, None]


def test_a_step_read_then_written_equals_one_written_as_it_reads(model):
  """extend(write=False) beside the cache, then write_new: the logits and
  the cache of extend writing first (keys, values, valid), the sums in
  another order, and the index moved for the rows holding a request
  only."""
  cache, nxt, active = _stepped_rows(model)
  expected, written = model.extend(nxt, cache, active)
  logits, new = model.extend(nxt, cache, active, write=False)
  np.testing.assert_allclose(logits, expected, rtol=2e-6, atol=2e-6)
  got = write_new(cache, new)
  assert written.index.tolist() == [5, 10, 7]
  assert got.index.tolist() == [5, 10, 6]
  np.testing.assert_array_equal(got.valid, written.valid)
  for a, b in zip(got.keys + got.values, written.keys + written.values):
    # (a second layer's keys come from the first's output: same sums)
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6)


def test_the_decode_step_copies_no_cache(model):
  """The decode step reads the cache and its write updates it in place:
  no copy of a cache array in either program. One program that writes
  the cache and then attends it (extend as generate.py runs it) copies
  each layer's keys on this compiler at one row: why the step is two."""
  cache, nxt, active = _stepped_rows(model, lengths=(4,))
  graphdef, state = nnx.split(model)
  shape = ','.join(map(str, cache.keys[0].shape))

  def copies(compiled):
    return [line for line in compiled.as_text().splitlines()
            if re.search(rf'= f32\[{shape}\]\S* (copy|transpose)\(', line)]

  sampling = programs.Sampling(np.zeros(1, np.float32),
                               np.ones(1, np.float32),
                               np.zeros((1, 2), np.uint32),
                               np.zeros(1, np.int32))
  bound = programs.bind(graphdef)
  args = (state, cache, nxt[:, 0], active[:, 0], sampling)
  step = bound.decode_step.lower(*args).compile()
  _, new = bound.decode_step(*args)
  write = bound.write_step.lower(cache, new).compile()
  assert not copies(step) and not copies(write)

  def written_then_read(state, cache):
    return nnx.merge(graphdef, state).extend(nxt, cache, active)
  both = jax.jit(written_then_read, donate_argnums=1).lower(
      state, cache).compile()
  assert copies(both)


def test_greedy_is_the_argmax_with_ties_to_the_lowest_id():
  logits = np.random.default_rng(2).normal(size=(5, 97)).astype(np.float32)
  logits[1, [4, 9, 60]] = 9.0  # a tie: the lowest id wins
  logits[2] = 0.0
  np.testing.assert_array_equal(programs.greedy(jnp.asarray(logits)),
                                np.argmax(logits, axis=-1))
  assert list(programs.greedy(jnp.asarray(logits))[1:3]) == [4, 0]
  logits[3, [7, 30]] = np.nan  # a NaN is the max, as argmax has it
  assert programs.greedy(jnp.asarray(logits))[3] == np.argmax(logits[3]) == 7
