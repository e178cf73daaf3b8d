"""KV-cached decoding: greedy, sampling and beam search against full forwards.

Models are tiny and untied (a tied random head mostly predicts its input).
Each distinct (config, shapes, sampler, beam size) compiles once, so tests
share models and shapes where they can.
"""

import functools
import io
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import script_helpers
import torch
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_transformer as jt
from jax_transformer import decoding
from jax_transformer.decoding import beam_search, generate, length_penalty
from jax_transformer.decoding.sampling import Sampler, greedy
from jax_transformer.interop import torch_compat as tc
from jax_transformer.interop.torch_reference import TorchTransformer

V = 29
N = 6
ED = jt.ModelConfig(vocab_size=V, d_model=16, num_heads=2, d_ff=32,
                    num_encoder_layers=1, num_decoder_layers=2,
                    tie_embeddings=False)
LM = jt.ModelConfig(vocab_size=V, d_model=16, num_heads=2, num_kv_heads=1,
                    d_ff=32, num_encoder_layers=0, num_decoder_layers=2,
                    norm_first=True, positional='rotary', activation='swiglu',
                    norm='rmsnorm', use_bias=False, scale_embeddings=False,
                    tie_embeddings=False, max_len=16)
CONFIGS = {
    'lm-pre': LM,
    'lm-post': LM.replace(norm_first=False, positional='learned',
                          norm='layernorm', activation='gelu'),
    'ed-pre': ED.replace(norm_first=True),
    'ed-post': ED,
}
# Mixed lengths, right-padded with PAD 0.
PROMPTS = np.array([[1, 5, 9, 0, 0], [1, 7, 3, 12, 20], [1, 4, 0, 0, 0]])
SOURCES = np.array([[5, 6, 7, 8, 2, 0], [9, 10, 2, 0, 0, 0],
                    [11, 12, 13, 14, 15, 2]])
PREFIXES = np.array([[1, 8, 0], [1, 0, 0], [1, 17, 4]])


@functools.cache
def model(name, seed=0):
  config = CONFIGS[name]
  cls = jt.EncoderDecoder if name.startswith('ed') else jt.DecoderLM
  return cls(config, nnx.Rngs(seed))


def real(row):
  return [int(x) for x in row if x != 0]


def inputs(name):
  """The test batch of each model: prompts, or sources (+ prefixes)."""
  if name.startswith('lm'):
    return dict(prompt_ids=PROMPTS)
  if name == 'ed-pre':
    return dict(src_ids=SOURCES, prompt_ids=PREFIXES)
  return dict(src_ids=SOURCES)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids, src, src_mask):
  m = nnx.merge(graphdef, state)
  return m(ids) if src is None else m(src, ids, src_mask)


def forward(m, ids, src=None):
  """Full-forward logits [B, T, V] (jitted; src padding masked)."""
  src_mask = None if src is None else jnp.asarray(src) != 0
  return _forward(*nnx.split(m), jnp.asarray(ids), src, src_mask)


def full_forward_loop(m, choose, n, prompts, src=None):
  """The reference: re-run the whole model on the growing sequences.

  Each row's tokens sit at the start of a fixed buffer (so nothing
  recompiles); later slots hold zeros that the causal mask hides.
  """
  b = len(prompts)
  ends = np.array([len(p) for p in prompts])
  buf = np.zeros((b, ends.max() + n), np.int32)
  for i, p in enumerate(prompts):
    buf[i, :len(p)] = p
  rows = np.arange(b)
  for _ in range(n):
    logits = forward(m, buf, src)[rows, ends - 1]
    buf[rows, ends] = np.asarray(choose(logits, jax.random.key(0)))
    ends += 1
  return np.stack([buf[i, len(p):len(p) + n] for i, p in enumerate(prompts)])


def reference_rows(name, choose, n=N):
  batch = inputs(name)
  if 'prompt_ids' in batch:
    prompts = [real(r) for r in batch['prompt_ids']]
  else:
    prompts = [[1]] * 3
  return full_forward_loop(model(name), choose, n, prompts,
                           batch.get('src_ids'))


def middle_rank(logits, key=None):
  """A deterministic chooser far more sensitive than argmax: the median."""
  return jnp.argsort(-logits, axis=-1)[:, V // 2].astype(jnp.int32)


@functools.cache
def greedy_tokens(name):
  return np.asarray(generate(model(name), **inputs(name), max_new_tokens=N,
                             eos_id=None).tokens)


@pytest.mark.parametrize('name', list(CONFIGS))
def test_greedy_equals_an_argmax_loop_over_full_forwards(name):
  np.testing.assert_array_equal(greedy_tokens(name),
                                reference_rows(name, greedy))


def test_cached_steps_follow_a_rank_sensitive_chooser():
  """Argmax of a random post-norm translator barely moves; the median does."""
  out = generate(model('ed-post'), **inputs('ed-post'), max_new_tokens=N,
                 sampler=middle_rank, key=jax.random.key(0), eos_id=None)
  want = reference_rows('ed-post', middle_rank)
  np.testing.assert_array_equal(out.tokens, want)
  assert len(set(want.ravel())) > 3


def test_repeated_calls_with_the_same_shapes_do_not_recompile():
  greedy_tokens('lm-pre')
  before = decoding.loop.generate_jit._cache_size()
  other = jt.DecoderLM(LM, nnx.Rngs(5))           # new weights, same shapes
  out = generate(other, PROMPTS[::-1].copy(), max_new_tokens=N, eos_id=7)
  assert decoding.loop.generate_jit._cache_size() == before
  assert out.tokens.shape == (3, N)


# ----------------------------------------------------------------------------
# EOS, lengths, early exit.

STEPS = []


def counting_greedy(logits, key):
  """greedy that records each executed step (not each trace)."""
  jax.debug.callback(lambda: STEPS.append(1))
  return greedy(logits)


def truncate_at(tokens, eos):
  """Expected output when every row stops at its first eos."""
  out, lengths = np.zeros_like(tokens), []
  for i, row in enumerate(tokens):
    hits = np.flatnonzero(row == eos)
    n = hits[0] + 1 if hits.size else len(row)
    out[i, :n] = row[:n]
    lengths.append(n)
  return out, np.array(lengths)


@pytest.fixture
def chunk_of(monkeypatch):
  """Sets the decoding loop's chunk size (it is read when the loop is
  traced, so the jit caches are cleared around the change)."""
  def clear():
    decoding.loop.generate_jit.clear_cache()
    decoding.beam.beam_search_jit.clear_cache()

  def set_chunk(size):
    clear()
    monkeypatch.setattr(decoding.loop, 'CHUNK', size)
  yield set_chunk
  clear()


def test_each_sequence_stops_at_its_own_eos_and_the_loop_exits_early(
    chunk_of):
  chunk_of(1)  # "all finished?" after every step: exits at the exact step
  m = model('lm-pre')
  run = functools.partial(generate, m, max_new_tokens=N,
                          sampler=counting_greedy, key=jax.random.key(0))
  STEPS.clear()
  free = np.asarray(run(PROMPTS, eos_id=None).tokens)
  jax.effects_barrier()
  assert len(STEPS) == N
  np.testing.assert_array_equal(free, greedy_tokens('lm-pre'))
  first = {}  # eos candidate -> step at which each row first emits it
  for tok in set(free.ravel()) - {0}:
    first[tok] = [int(np.argmax(r == tok)) if (r == tok).any() else None
                  for r in free]
  # A token some rows emit before the last step and some never.
  partial = [t for t, f in first.items()
             if None in f and any(x is not None and x < N - 1 for x in f)]
  assert partial, free
  eos = partial[0]
  out = run(PROMPTS, eos_id=int(eos))
  want, lengths = truncate_at(free, eos)
  np.testing.assert_array_equal(out.tokens, want)
  np.testing.assert_array_equal(out.lengths, lengths)
  assert lengths.min() < N and lengths.max() == N
  # Rows that all emit a token before the last step: the loop stops early.
  row = free[2]
  late = [t for t in set(row) if 0 < np.argmax(row == t) < N - 1]
  assert late, row
  eos = max(late, key=lambda t: np.argmax(row == t))
  STEPS.clear()
  out = run(PROMPTS[[2, 2, 2]], eos_id=int(eos))
  jax.effects_barrier()
  want, lengths = truncate_at(free[[2, 2, 2]], eos)
  np.testing.assert_array_equal(out.tokens, want)
  assert len(STEPS) == lengths.max() < N


@pytest.mark.parametrize('chunk', [2, 4, 16])
def test_chunks_give_the_same_tokens_and_stop_at_a_chunk_boundary(chunk,
                                                                  chunk_of):
  """The fixed-trip chunks overrun the last useful step by less than a
  chunk, and change no returned token or length."""
  m = model('lm-pre')
  free = np.asarray(greedy_tokens('lm-pre'))
  row = free[2]
  eos = int(row[2])  # row 2 ends at its third token
  chunk_of(1)
  want = generate(m, PROMPTS, max_new_tokens=N, eos_id=eos)
  chunk_of(chunk)
  STEPS.clear()
  got = generate(m, PROMPTS[[2, 2]], max_new_tokens=N, eos_id=eos,
                 sampler=counting_greedy, key=jax.random.key(0))
  jax.effects_barrier()
  np.testing.assert_array_equal(got.tokens, np.asarray(want.tokens)[[2, 2]])
  np.testing.assert_array_equal(got.lengths, np.asarray(want.lengths)[[2, 2]])
  step = min(chunk, N - 1)
  assert len(STEPS) == 1 + step * -(-(int(got.lengths.max()) - 1) // step)
  got_all = generate(m, PROMPTS, max_new_tokens=N, eos_id=eos)
  np.testing.assert_array_equal(got_all.tokens, want.tokens)
  np.testing.assert_array_equal(got_all.lengths, want.lengths)


# ----------------------------------------------------------------------------
# Sampling.


def model_logits(name, new_tokens):
  """Full-forward logits that chose each new token: [B, N, V]."""
  prompts = [real(p) for p in PROMPTS]
  new_tokens = np.asarray(new_tokens)
  buf = np.zeros((3, PROMPTS.shape[1] + N), np.int32)
  for i, p in enumerate(prompts):
    buf[i, :len(p) + N] = p + list(new_tokens[i])
  logits = np.asarray(forward(model(name), buf))
  return np.stack([logits[i, len(p) - 1:len(p) - 1 + N]
                   for i, p in enumerate(prompts)])


def test_sampling_is_reproducible_per_key_and_stays_in_the_top_k():
  sampler = Sampler(temperature=2.0, top_k=4)
  run = functools.partial(generate, model('lm-pre'), PROMPTS,
                          max_new_tokens=N, sampler=sampler, eos_id=None)
  a = np.asarray(run(key=jax.random.key(0)).tokens)
  np.testing.assert_array_equal(a, run(key=jax.random.key(0)).tokens)
  b = np.asarray(run(key=jax.random.key(1)).tokens)
  assert (a != b).any()
  logits = model_logits('lm-pre', a)
  top4 = np.argsort(-logits, axis=-1)[..., :4]
  assert (top4 == a[..., None]).any(-1).all()
  # Not merely greedy: high temperature picks other allowed tokens too.
  assert (a != greedy_tokens('lm-pre')).any()


def test_top_p_samples_stay_in_the_nucleus():
  p = 0.6
  out = generate(model('lm-pre'), PROMPTS, max_new_tokens=N,
                 sampler=Sampler(top_p=p), key=jax.random.key(3), eos_id=None)
  tokens = np.asarray(out.tokens)
  probs = jax.nn.softmax(model_logits('lm-pre', tokens), axis=-1)
  probs = np.asarray(probs)
  # Mass of the tokens strictly more likely than the chosen one is < p.
  chosen = np.take_along_axis(probs, tokens[..., None], -1)
  before = np.where(probs > chosen, probs, 0).sum(-1)
  assert (before < p).all()


def test_top_k_one_equals_greedy():
  out = generate(model('lm-pre'), PROMPTS, max_new_tokens=N,
                 sampler=Sampler(top_k=1), key=jax.random.key(9),
                 eos_id=None)
  np.testing.assert_array_equal(out.tokens, greedy_tokens('lm-pre'))


def test_sampling_without_a_key_is_refused():
  with pytest.raises(ValueError, match='Sampling needs a key'):
    generate(model('lm-pre'), PROMPTS, max_new_tokens=2, sampler=Sampler())


# ----------------------------------------------------------------------------
# Beam search.


def token_logps(m, prompt, seqs, src=None):
  """log p(seqs[:, t] | prompt, seqs[:, :t]) by one full forward: [M, L]."""
  seqs = np.asarray(seqs)
  ctx = np.tile(prompt, (len(seqs), 1))
  ids = np.concatenate([ctx, seqs[:, :-1]], axis=1)
  src = None if src is None else np.tile(src, (len(seqs), 1))
  logits = forward(m, ids, src)
  logp = np.asarray(jax.nn.log_softmax(logits[:, len(prompt) - 1:], -1))
  return np.take_along_axis(logp, seqs[..., None], -1)[..., 0]


def hypothesis(tokens, eos):
  """A hypothesis ends at its first EOS, or at the last slot."""
  tokens = list(tokens)
  return tuple(tokens[:tokens.index(eos) + 1] if eos in tokens else tokens)


def exhaustive(m, prompt, vocab, length, alpha, eos, src=None):
  """Every hypothesis of at most `length` new tokens, with its score."""
  seqs = np.array(list(itertools.product(range(vocab), repeat=length)))
  logps = token_logps(m, prompt, seqs, src)
  scores = {}
  for seq, lp in zip(seqs, logps):
    h = hypothesis(seq, eos)
    scores[h] = lp[:len(h)].sum() / float(length_penalty(len(h), alpha))
  return scores


TINY = jt.ModelConfig(vocab_size=5, d_model=16, num_heads=2, d_ff=32,
                      num_encoder_layers=1, num_decoder_layers=2,
                      tie_embeddings=False, norm_first=True)


def tiny_lm():
  return jt.DecoderLM(TINY.replace(num_encoder_layers=0), nnx.Rngs(5))


# Seeds where the best hypothesis is not the greedy one for some row: an
# early EOS (ed) and a different 3-token sequence (lm).
@pytest.mark.parametrize('kind,alpha', [('ed', 1.0), ('lm', 1.5)])
def test_beam_search_finds_the_exhaustive_best_on_a_tiny_vocabulary(kind,
                                                                     alpha):
  length, eos = 3, 2
  if kind == 'ed':
    m = jt.EncoderDecoder(TINY.replace(scale_embeddings=False), nnx.Rngs(4))
    src = np.array([[3, 4, 3, 2], [4, 4, 2, 0]])
    batch, prompts, srcs = dict(src_ids=src), [[1], [1]], [real(r) for r in src]
  else:
    m = tiny_lm()
    prompt = np.array([[1, 3, 4], [1, 4, 0]])
    batch, prompts, srcs = dict(prompt_ids=prompt), [real(r) for r in prompt], [
        None, None]
  # Beam 25 = 5 ** (length - 1) keeps every live prefix: search is exact.
  out = beam_search(m, **batch, beam_size=25, alpha=alpha, max_len=length,
                    eos_id=eos)
  greedy_out = generate(m, **batch, max_new_tokens=length, eos_id=eos)
  beats_greedy = []
  for i in range(2):
    scores = exhaustive(m, prompts[i], 5, length, alpha, eos, srcs[i])
    best = max(scores, key=scores.get)
    got = tuple(np.asarray(out.tokens[i, :int(out.lengths[i])]).tolist())
    assert got == best, (got, best, scores[best])
    np.testing.assert_allclose(out.scores[i], scores[best], atol=1e-5)
    assert (out.tokens[i, len(best):] == 0).all()
    g = hypothesis(np.asarray(greedy_out.tokens[i]).tolist(), eos)
    beats_greedy.append(scores[best] > scores[g] + 1e-6)
  # The case is not trivial: for some row the best is not the greedy one.
  assert any(beats_greedy)


def test_a_narrow_beam_reports_the_score_of_what_it_returns():
  m, prompt = tiny_lm(), np.array([[1, 3, 4], [1, 4, 0]])
  out = beam_search(m, prompt, beam_size=2, alpha=1.5, max_len=3)
  missed = []
  for i, p in enumerate([real(r) for r in prompt]):
    scores = exhaustive(m, p, 5, 3, 1.5, 2)
    got = tuple(np.asarray(out.tokens[i, :int(out.lengths[i])]).tolist())
    np.testing.assert_allclose(out.scores[i], scores[got], atol=1e-5)
    missed.append(scores[got] < max(scores.values()) - 1e-6)
  # The beam is narrow enough to matter: for some row (row 1: (3, 1, 3)
  # at -1.219, not (3, 4, 3) at -1.170) it returns a hypothesis other than
  # exact search's, and the score reported is that one's.
  assert any(missed)


def test_beam_size_one_is_greedy():
  m, batch = model('ed-post'), inputs('ed-post')
  free = greedy_tokens('ed-post')
  eos = int(free[1, 2])  # stops row 1 early (and any row emitting it)
  g = generate(m, **batch, max_new_tokens=N, eos_id=eos)
  b = beam_search(m, **batch, beam_size=1, max_len=N, eos_id=eos, alpha=0.6)
  np.testing.assert_array_equal(b.tokens, g.tokens)
  np.testing.assert_array_equal(b.lengths, g.lengths)
  assert int(g.lengths.min()) < N
  for i in range(3):
    n = int(b.lengths[i])
    lp = token_logps(m, [1], np.asarray(b.tokens)[i:i + 1, :n],
                     real(SOURCES[i]))
    np.testing.assert_allclose(
        b.scores[i], lp.sum() / float(length_penalty(n, 0.6)), atol=1e-5)


# ----------------------------------------------------------------------------
# Sharded decoding: 8 CPU devices (conftest.py).

RULES = {'mlp': 'tensor', 'heads': 'tensor', 'kv_heads': 'tensor'}


def shard_params(m, mesh):
  """Parameters split over 'tensor' by their logical axis names."""
  for _, var in nnx.to_flat_state(nnx.state(m, nnx.Param)):
    spec = P(*(RULES.get(a) for a in var.get_metadata()['out_sharding']))
    var.set_value(jax.device_put(var[...], NamedSharding(mesh, spec)))
  return m


BIG_SOURCES = np.random.RandomState(0).randint(3, V, (8, 7))
BIG_SOURCES[::3, 5:] = 0  # mixed lengths


@pytest.mark.slow
def test_sharded_decoding_equals_unsharded():
  assert jax.device_count() == 8
  m = model('ed-pre')
  want = generate(m, src_ids=BIG_SOURCES, max_new_tokens=N, eos_id=None)
  mesh = jax.make_mesh((8, 1, 1), ('data', 'fsdp', 'tensor'))
  with jax.set_mesh(mesh):
    got = generate(m, src_ids=BIG_SOURCES, max_new_tokens=N, eos_id=None)
  assert len(got.tokens.sharding.device_set) == 8
  np.testing.assert_array_equal(got.tokens, want.tokens)
  # Parameters committed to one device (as a restored checkpoint) are
  # replicated over the mesh.
  one = NamedSharding(jax.sharding.Mesh(jax.devices()[:1], ('data',)), P())
  restored = jt.EncoderDecoder(CONFIGS['ed-pre'], nnx.Rngs(0))
  for _, var in nnx.to_flat_state(nnx.state(restored, nnx.Param)):
    var.set_value(jax.device_put(var[...], one))
  with jax.set_mesh(mesh):
    got = generate(restored, src_ids=BIG_SOURCES, max_new_tokens=N,
                   eos_id=None)
  np.testing.assert_array_equal(got.tokens, want.tokens)

  want = beam_search(m, src_ids=BIG_SOURCES, beam_size=2, max_len=N)
  mesh = jax.make_mesh((4, 1, 2), ('data', 'fsdp', 'tensor'))
  sharded = shard_params(jt.EncoderDecoder(CONFIGS['ed-pre'], nnx.Rngs(0)),
                         mesh)
  assert not sharded.decoder_layers[0].ff.wi[...].sharding.is_fully_replicated
  got = beam_search(sharded, src_ids=BIG_SOURCES, beam_size=2, max_len=N,
                    mesh=mesh)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_allclose(got.scores, want.scores, atol=1e-5)


# ----------------------------------------------------------------------------
# The PyTorch reference model.


@pytest.mark.parametrize('norm_first', [False, True])
def test_imported_torch_model_decodes_like_a_torch_greedy_loop(norm_first):
  config = jt.ModelConfig(vocab_size=V, d_model=16, num_heads=2, d_ff=32,
                          num_encoder_layers=2, num_decoder_layers=2,
                          dropout_rate=0.0, attention_dropout_rate=0.0,
                          tie_embeddings=False, norm_first=norm_first)
  torch.manual_seed(2)  # PyTorch's own init: far from degenerate outputs
  ref = TorchTransformer.from_config(config).eval()
  m = tc.encoder_decoder_from_torch(ref.state_dict(), config)
  src = SOURCES
  pad = torch.from_numpy(src == 0)
  with torch.no_grad():
    tgt = torch.ones((3, 1), dtype=torch.long)
    for _ in range(N):
      logits = ref(torch.from_numpy(src).long(), tgt,
                   src_key_padding_mask=pad)
      tgt = torch.cat([tgt, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
  want = tgt[:, 1:].numpy()
  got = generate(m, src_ids=src, max_new_tokens=N, eos_id=None)
  np.testing.assert_array_equal(got.tokens, want)
  assert len(set(want.ravel())) > 5, want


# ----------------------------------------------------------------------------
# Bad input: one clear sentence, raised before anything compiles.


def bad_calls():
  ed, lm = model('ed-post'), model('lm-post')  # lm-post: learned, max_len 16
  return {
      'empty prompt': (lambda: generate(lm, np.zeros((1, 0), int),
                                        max_new_tokens=2), 'is empty'),
      'all padding': (lambda: generate(lm, [[1, 2], [0, 0]],
                                       max_new_tokens=2), 'no real tokens'),
      'id too large': (lambda: generate(lm, [[1, V]], max_new_tokens=2),
                       f'token id {V}, outside'),
      'negative id': (lambda: generate(lm, [[1, -3]], max_new_tokens=2),
                      'token id -3, outside'),
      'one dimension': (lambda: generate(lm, [1, 2], max_new_tokens=2),
                        'must be 2-D'),
      'float ids': (lambda: generate(lm, np.ones((1, 2)), max_new_tokens=2),
                    'integer token ids'),
      'too long': (lambda: generate(lm, np.ones((1, 10), int),
                                    max_new_tokens=7), "max_len=16"),
      'rotary prompt too long': (lambda: generate(
          model('lm-pre'), np.ones((1, 17), int), max_new_tokens=2),
                                 "length 17, longer than the model's "
                                 'max_len=16'),
      'no new tokens': (lambda: generate(lm, [[1]], max_new_tokens=0),
                        'max_new_tokens must be an integer >= 1'),
      'no source': (lambda: generate(ed, max_new_tokens=2), 'needs src_ids'),
      'empty source': (lambda: generate(ed, src_ids=[[0, 0]],
                                        max_new_tokens=2), 'no real tokens'),
      'source to an LM': (lambda: generate(lm, [[1]], src_ids=[[3]],
                                           max_new_tokens=2), 'no source'),
      'no prompt': (lambda: generate(lm, max_new_tokens=2), 'needs prompt'),
      'batch mismatch': (lambda: generate(ed, [[1], [1]], src_ids=[[3]],
                                          max_new_tokens=2), 'has 1 rows'),
      'mask shape': (lambda: generate(lm, [[1, 2]], [[True]],
                                      max_new_tokens=2), 'prompt_mask has'),
      'eos outside': (lambda: generate(lm, [[1]], max_new_tokens=2,
                                       eos_id=V), 'eos_id='),
      'not a model': (lambda: generate(object(), [[1]], max_new_tokens=2),
                      'EncoderDecoder or DecoderLM'),
      'beam size': (lambda: beam_search(lm, [[1]], beam_size=0),
                    'beam_size must be'),
      'alpha': (lambda: beam_search(lm, [[1]], alpha=-1.0), 'alpha must be'),
      'beam too long': (lambda: beam_search(lm, [[1, 3]], max_len=15),
                        'max_len=15 exceeds'),
      'no room': (lambda: beam_search(lm, np.ones((1, 16), int)),
                  'leaves no room'),
      'mesh batch': (lambda: generate(
          lm, [[1]] * 3, max_new_tokens=2,
          mesh=jax.make_mesh((8, 1, 1), ('data', 'fsdp', 'tensor'))),
                     "not divisible by the mesh's 'data' axis"),
  }


@pytest.mark.parametrize('case', list(bad_calls()))
def test_bad_input_is_one_clear_sentence_before_compiling(case):
  call, fragment = bad_calls()[case]
  sizes = (decoding.loop.generate_jit._cache_size(),
           decoding.beam.beam_search_jit._cache_size())
  with pytest.raises((ValueError, TypeError)) as info:
    call()
  message = str(info.value)
  assert fragment in message
  assert '\n' not in message and message.endswith('.')
  assert sizes == (decoding.loop.generate_jit._cache_size(),
                   decoding.beam.beam_search_jit._cache_size())


def test_default_beam_length_is_input_plus_50_capped_by_learned_positions():
  # lm-post has learned positions and max_len 16: 2 prompt + 14 new.
  out = beam_search(model('lm-post'), [[1, 3]], beam_size=1, eos_id=None)
  assert out.tokens.shape == (1, 14)


# ----------------------------------------------------------------------------
# scripts/generate.py, without a checkpoint.


def load_script():
  return script_helpers.load_script('generate')


class LetterTokenizer:
  """a..z as ids 3..28; specials dropped on decode, like the real ones."""
  vocab_size = V

  def encode(self, text):
    return [ord(c) - ord('a') + 3 for c in text if 'a' <= c <= 'z']

  def decode(self, ids):
    return ''.join(chr(i - 3 + ord('a')) for i in ids if i >= 3)


@pytest.mark.slow
def test_generate_script_runs_each_model_and_mode(tmp_path, capsys):
  script = load_script()
  tok = LetterTokenizer()

  def args(*extra):
    return script.parse_args(['--workdir', str(tmp_path), '--input', 'abc',
                              *extra])

  ed, lm = model('ed-post'), model('lm-pre')
  text = script.run(ed, tok, args('--max_new_tokens', '4'))
  want = generate(ed, src_ids=[[3, 4, 5, 2]], max_new_tokens=4)
  n = int(want.lengths[0])
  expected = np.asarray(want.tokens[0, :n]).tolist()
  assert text == tok.decode([t for t in expected if t != 2])
  sampled = [script.run(lm, tok, args('--top_k', '3', '--temperature', '2',
                                      '--seed', str(s), '--max_new_tokens',
                                      '4')) for s in (0, 0, 1)]
  assert sampled[0] == sampled[1] and sampled[0].startswith('abc')
  # A decoder-only model prints the prompt and its continuation.
  beam = script.run(lm, tok, args('--beam_size', '2', '--max_new_tokens',
                                  '3'))
  want = beam_search(lm, [[1, 3, 4, 5]], beam_size=2, max_len=3)
  n = int(want.lengths[0])
  assert beam == 'abc' + tok.decode(np.asarray(want.tokens[0, :n]).tolist())
  # main() with an injected loader prints the text and exits 0.
  code = script.main(['--workdir', str(tmp_path), '--input', 'abc',
                      '--max_new_tokens', '4'],
                     load=lambda _: (ed, tok, False))
  assert code == 0 and capsys.readouterr().out == text + '\n'




@pytest.mark.parametrize('argv,fragment', [
    (['--input', '   '], '--input is empty'),
    (['--input', '123'], 'encodes to no tokens'),
    (['--input', 'ab', '--beam_size', '0'], '--beam_size must be'),
    (['--input', 'ab', '--beam_size', '2', '--top_p', '0.9'],
     'does not sample'),
    (['--input', 'ab', '--top_p', '1.5'], '--top_p must be in (0, 1]'),
    (['--input', 'ab', '--temperature', '-1'], '--temperature must be'),
    (['--input', 'ab', '--max_new_tokens', '0'], '--max_new_tokens must be'),
    (['--input', 'a' * 20, '--max_new_tokens', '2'], "max_len=16"),
])
def test_generate_script_bad_input_exits_2(tmp_path, capsys, argv, fragment):
  script = load_script()
  code = script.main(['--workdir', str(tmp_path), *argv],
                     load=lambda _: (model('lm-post'), LetterTokenizer(),
                                     False))
  err = capsys.readouterr().err.strip()
  assert code == 2
  assert fragment in err and '\n' not in err


def test_generate_script_refuses_a_missing_workdir(tmp_path, capsys):
  script = load_script()
  code = script.main(['--workdir', str(tmp_path / 'nope'), '--input', 'ab'],
                     load=lambda _: pytest.fail('must not load'))
  assert code == 2 and 'is not a directory' in capsys.readouterr().err


# Lines of mixed lengths (blank ones included) for --input_file. With
# batch size 3 the batches are padded, the last one partial; lm-post's
# learned positions (max_len 16) give each line its own new-token limit.
LINES = ['abc', 'hello there', '', 'x', 'abcdefghij', '  ', 'mnop']


def run_main(script, capsys, argv, m):
  """(exit code, stdout, stderr) of generate.py with a tiny model."""
  code = script.main(['--workdir', '.', *argv],
                     load=lambda _: (m, LetterTokenizer(), False))
  out, err = capsys.readouterr()
  return code, out, err


# Seed 3 gives tiny encoder-decoders that do not end every output at once.
@pytest.mark.slow
@pytest.mark.parametrize('name,seed,flags', [
    ('ed-post', 3, []), ('lm-post', 0, []),
    ('ed-pre', 3, ['--beam_size', '2', '--max_new_tokens', '3'])])
def test_generate_script_file_equals_one_input_at_a_time(tmp_path, capsys,
                                                         name, seed, flags):
  script, m = load_script(), model(name, seed)
  path, out = tmp_path / 'in.txt', tmp_path / 'out.txt'
  path.write_text('\n'.join(LINES) + '\n')
  code, stdout, err = run_main(
      script, capsys, ['--input_file', str(path), '--output_file', str(out),
                       '--batch_size', '3', *flags], m)
  assert code == 0, err
  assert stdout == ''
  got = out.read_text().split('\n')
  assert got[-1] == '' and len(got) == len(LINES) + 1
  want = []
  for line in LINES:
    if not line.strip():
      want.append('')
      continue
    code, single, err = run_main(script, capsys, ['--input', line, *flags],
                                 m)
    assert code == 0, err
    want.append(single.removesuffix('\n'))
  assert got[:-1] == want
  # Something was decoded: not every output is its input or empty.
  assert any(w not in ('', line) for w, line in zip(want, LINES))


def test_generate_script_reads_stdin_and_samples_deterministically(
    capsys, monkeypatch):
  script, m = load_script(), model('lm-pre')
  sample = ['--input_file', '-', '--batch_size', '2', '--top_k', '3',
            '--temperature', '2', '--max_new_tokens', '6']

  def run(seed):
    monkeypatch.setattr('sys.stdin', io.StringIO('ab\n\nxyz\nq\n'))
    code, out, err = run_main(script, capsys, [*sample, '--seed', seed], m)
    assert code == 0, err
    return out.split('\n')

  first = run('1')
  assert len(first) == 5 and first[1] == '' and first[-1] == ''
  assert all(o.startswith(p) for o, p in zip(first, ['ab', '', 'xyz', 'q']))
  assert run('1') == first
  assert run('2') != first


@pytest.mark.parametrize('content,flags,fragment', [
    (None, [], 'does not exist'),
    ('', [], 'is empty'),
    ('abc\n123\n', [], 'Line 2 of --input_file'),
    ('abc\n' + 'a' * 20 + '\n', [], 'max_len=16'),
    ('ab\nabcdefghijklm\n', ['--max_new_tokens', '4'], 'with 4 new tokens'),
    ('ab\n', ['--batch_size', '0'], '--batch_size must be'),
    ('ab\n', ['--output_file', 'nowhere/out.txt'], 'does not exist'),
])
def test_generate_script_bad_file_exits_2(tmp_path, capsys, content, flags,
                                          fragment):
  path = tmp_path / 'in.txt'
  if content is not None:
    path.write_text(content)
  code, out, err = run_main(load_script(), capsys,
                            ['--input_file', str(path), *flags],
                            model('lm-post'))
  assert code == 2 and out == ''
  assert fragment in err and err.count('\n') == 1, err


def test_generate_script_takes_input_or_input_file(tmp_path, capsys):
  script = load_script()
  for argv in ([], ['--input', 'a', '--input_file', 'f']):
    with pytest.raises(SystemExit) as e:
      script.parse_args(['--workdir', '.', *argv])
    assert e.value.code == 2
  code, _, err = run_main(script, capsys, ['--input', 'ab', '--output_file',
                                           str(tmp_path / 'o')],
                          model('lm-post'))
  assert code == 2 and 'goes with --input_file' in err
