"""Parity at the settings users run: XLA's defaults.

Every in-process comparison of the suite compiles at the tests' flags
(tests/xla_flags.py: LLVM at -O0, the elemental emitters, one LLVM
module), and at 'highest' matmul precision (conftest.py). Here the
families are compared again in a process of their own with no XLA_FLAGS
and JAX's default precision, on one CPU device, as a user's process
runs (the product sets no XLA option for CPUs: runtime/xla_options.py):
the encoder-decoder against PyTorch's nn.Transformer (torch_reference),
the decoder LM against transformers' Llama 3 and GPT-2. And the tests'
flags' own effect: the same tiny LM's forward and three train steps in
two processes, at the tests' flags and at the defaults, within what
xla_flags.py says of them.

Each process compares all three families and runs the LM
(numerics_at_flags.py): one process start and import a setting.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import repo
import xla_flags

HERE = os.path.dirname(os.path.abspath(__file__))

# As the in-process tests have them: test_torch_parity.py's 1e-5 for the
# encoder-decoder, test_hf_families.py's 2e-5 for Hugging Face families
# (float32 logits up to about 5, where float32's spacing is 4.8e-7).
# Measured at the defaults: 1.8e-6 (encoder-decoder), 7.0e-6 (Llama 3),
# 2.0e-6 (GPT-2); at the tests' flags 2.0e-6, 6.1e-6, 2.3e-6.
TOLERANCES = {'encoder_decoder': 1e-5, 'llama3': 2e-5, 'gpt2': 2e-5}

# The tests' flags against the defaults (xla_flags.py's figures), measured
# on this tiny LM: logits (up to 0.5) 1.5e-7 apart, parameters (up to
# 1.0) after three AdamW steps 6.7e-8. Asserted with a margin of 2x.
LOGITS_BOUND = 3e-7
PARAMS_BOUND = 1.5e-7

# One worker runs each setting's process once (module fixtures are per
# worker).
pytestmark = pytest.mark.xdist_group('parity_at_default_flags')


def run(tmp_path_factory, name: str, flags: str | None) -> dict:
  """numerics_at_flags.py in a process of its own with XLA_FLAGS=flags
  (unset where None): its result.json, and its lm.npz's arrays."""
  out = tmp_path_factory.mktemp(name)
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  if flags is not None:
    env['XLA_FLAGS'] = flags
  env['JAX_PLATFORMS'] = 'cpu'
  env['PYTHONPATH'] = os.pathsep.join((repo.ROOT, repo.TESTS, HERE))
  done = subprocess.run(
      [sys.executable, os.path.join(HERE, 'numerics_at_flags.py'), str(out)],
      env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(out / 'result.json') as f:
    result = json.load(f)
  with np.load(out / 'lm.npz') as lm:
    result['lm'] = dict(lm)
  return result


@pytest.fixture(scope='module')
def at_defaults(tmp_path_factory):
  return run(tmp_path_factory, 'defaults', None)


@pytest.fixture(scope='module')
def at_test_flags(tmp_path_factory):
  return run(tmp_path_factory, 'test_flags', xla_flags.cpu(1))


@pytest.mark.slow
@pytest.mark.parametrize('family', sorted(TOLERANCES))
def test_each_family_matches_its_reference_at_xla_defaults(at_defaults,
                                                          family):
  # What the process had in force, not what the session has: no
  # XLA_FLAGS, JAX's default matmul precision, one device.
  assert (at_defaults['xla_flags'], at_defaults['matmul_precision'],
          at_defaults['devices']) == (None, None, 1)
  compared = at_defaults[family]
  assert compared['max_abs_logit'] > 1.0  # non-trivial logits
  assert compared['max_abs_diff'] < TOLERANCES[family], (family, compared)


@pytest.mark.slow
def test_the_tests_flags_move_a_tiny_lm_within_what_xla_flags_py_says(
    at_defaults, at_test_flags):
  assert at_test_flags['xla_flags'] == xla_flags.cpu(1)
  assert at_test_flags['devices'] == at_defaults['devices'] == 1
  ours, users = at_test_flags['lm'], at_defaults['lm']
  assert ours.keys() == users.keys() and len(ours) > 2
  logits = float(np.abs(ours['logits'] - users['logits']).max())
  assert logits <= LOGITS_BOUND, logits
  params = max(float(np.abs(ours[k] - users[k]).max())
               for k in ours if k.startswith('param/'))
  assert params <= PARAMS_BOUND, params
  # The steps moved every parameter far more than the flags did: the
  # comparison is of trained ones.
  for k in users:
    if k.startswith('param/'):
      start = users['initial/' + k[len('param/'):]]
      assert np.abs(users[k] - start).max() > 1000 * PARAMS_BOUND, k
