"""The compilers' collective-overlap options: set once, per platform,
before the backend starts; named in the start line."""

import os
import shlex

import jax
import pytest

from jax_transformer.runtime import distributed, xla_options


@pytest.fixture
def clean_env(monkeypatch):
  for name in ('LIBTPU_INIT_ARGS', xla_options.ENV_SWITCH):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
  return monkeypatch


def test_apply_sets_each_platforms_variable(clean_env):
  added = xla_options.apply()
  tpu = shlex.split(os.environ['LIBTPU_INIT_ARGS'])
  gpu = shlex.split(os.environ['XLA_FLAGS'])
  assert tpu == [o for o, _ in xla_options.TPU]
  assert gpu[0] == '--xla_force_host_platform_device_count=8'
  assert gpu[1:] == [o for o, _ in xla_options.GPU]
  assert len(added) == len(xla_options.TPU) + len(xla_options.GPU)
  # Twice changes nothing.
  assert xla_options.apply() == []


def test_an_option_the_environment_names_keeps_its_value(clean_env):
  clean_env.setenv('LIBTPU_INIT_ARGS',
                   '--xla_tpu_enable_latency_hiding_scheduler=false')
  xla_options.apply(['tpu'])
  described = xla_options.describe('tpu')
  assert described.startswith('XLA overlap: lhs=false, async-fusion, ')
  assert described.endswith('(LIBTPU_INIT_ARGS)')
  assert 'XLA_FLAGS' not in described


def test_turned_off_adds_nothing_and_tells_child_processes(clean_env):
  assert xla_options.apply(on=False) == []
  assert 'LIBTPU_INIT_ARGS' not in os.environ
  assert xla_options.describe('tpu') == 'XLA overlap: off'
  # A child process (target_table.py's compiles) reads the switch.
  assert not xla_options.enabled()
  assert xla_options.apply() == []


def test_describe_names_the_short_forms_per_platform(clean_env):
  xla_options.apply()
  assert xla_options.describe('gpu') == (
      'XLA overlap: lhs, priority-stream, pipelined-ag, pipelined-rs, '
      'pipelined-ar (XLA_FLAGS)')
  assert xla_options.describe('cuda') == xla_options.describe('gpu')
  assert xla_options.describe('cpu') == 'XLA overlap: none for cpu'


def test_the_start_line_names_the_options_on_accelerators(clean_env):
  xla_options.apply()
  # On CPU host devices the line is as it was.
  assert distributed.describe_job().endswith('(cpu), 1 slice.')
  gpus = [type('D', (), dict(process_index=0, slice_index=0, platform='gpu',
                             device_kind='NVIDIA H100 80GB HBM3'))()
          for _ in range(8)]
  clean_env.setattr(jax, 'devices', lambda: gpus)
  clean_env.setattr(jax, 'local_devices', lambda: gpus)
  assert distributed.describe_job() == (
      'Job: 1 process (this is 0), 8 gpu devices each (NVIDIA H100 80GB '
      'HBM3), 1 slice. XLA overlap: lhs, priority-stream, pipelined-ag, '
      'pipelined-rs, pipelined-ar (XLA_FLAGS).')
