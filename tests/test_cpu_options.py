"""XLA:CPU's options the programs start with (``cpu_options``): set by
every program's ``then_exit``, an environment value kept, and YNNPACK
kept to dots by this jax's compiler."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from jax_transformer import cli, cpu_options

OPTION = '--xla_cpu_experimental_ynn_fusion_type'


def test_a_program_starts_with_the_options(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=2')
  seen = {}

  @cli.then_exit
  def main():
    seen['flags'] = os.environ['XLA_FLAGS']
    return 0

  assert main() == 0
  assert seen['flags'].split() == ['--xla_force_host_platform_device_count=2',
                                   *cpu_options.OPTIONS]


def test_the_environment_keeps_its_own_value(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', f'{OPTION}=LIBRARY_FUSION_TYPE_REDUCE')
  assert cpu_options.apply() == []
  assert os.environ['XLA_FLAGS'] == f'{OPTION}=LIBRARY_FUSION_TYPE_REDUCE'


def _ynn_fusions(compiled) -> dict[str, int]:
  """YNNPACK fusions of a compiled program, by what they hold."""
  text = compiled.as_text()
  counts = {'dot': 0, 'reduce': 0}
  for line in text.splitlines():
    if '__ynn_fusion' in line and ' fusion(' in line:
      name = line.split('calls=%')[1].split(',')[0]
      body = text.split(f'%{name} (')[1].split('\n}')[0]
      counts['dot'] += ' dot(' in body
      counts['reduce'] += ' reduce(' in body
  return counts


def test_ynnpack_keeps_the_dots_and_leaves_the_reductions():
  """A softmax's sum after a product: by default YNNPACK takes both (the
  logits' log-sum-exp it took slowly); with the options only the dot.
  The result is the same."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 128)),
                  jnp.float32)
  w = jnp.asarray(np.random.default_rng(1).normal(size=(128, 1000)),
                  jnp.float32) * 0.05
  lowered = jax.jit(lambda x, w: jax.nn.logsumexp(x @ w, axis=-1)).lower(
      x, w)
  default = lowered.compile()
  ours = lowered.compile(compiler_options=cpu_options.as_compiler_options())
  assert _ynn_fusions(default)['reduce'] > 0
  counts = _ynn_fusions(ours)
  assert counts['dot'] > 0 and counts['reduce'] == 0
  np.testing.assert_allclose(ours(x, w), default(x, w), rtol=1e-6)
