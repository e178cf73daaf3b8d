"""The restart-to-first-step line: its parts add up, the benchmark reads
it back, and JAX's compilation-cache events decide hit or miss."""

import jax
import jax.numpy as jnp

from jax_transformer.train import first_step
from jax_transformer.train.goodput import Clock


def test_the_line_splits_the_wall_time_and_reads_back():
  clock = Clock(started=0.0)
  clock.totals.update(startup=10.0, compile=4.0, data_wait=0.5)
  first = first_step.FirstStep()
  first.seconds.update({'restore': 2.0, 'data iterator': 1.0})
  got = first_step.parse('noise\n' + first.line(clock, 9) + '\n')
  assert got['first_step'] == 9 and got['cache'] == 'not cached'
  assert (got['startup_s'], got['restore_s'], got['data_iterator_s'],
          got['compile_s']) == (7.0, 2.0, 1.5, 4.0)
  parts = sum(got[k] for k in ('startup_s', 'restore_s', 'data_iterator_s',
                               'compile_s', 'other_processes_s', 'step_s'))
  assert abs(parts - got['to_first_step_s']) < 0.5
  assert first_step.parse('no such line') is None


def test_a_compile_read_from_the_persistent_cache_is_a_hit(tmp_path):
  events = first_step.cache_events()
  before = dict(events.counts)
  jax.monitoring.record_event(first_step.MISS)
  assert events.verdict(before) == 'cache miss'
  before = dict(events.counts)
  jax.monitoring.record_event(first_step.HIT)
  assert events.verdict(before) == 'cache hit'
  before = dict(events.counts)
  jax.jit(lambda x: x + 1).lower(jnp.ones(3)).compile()  # under threshold
  assert events.verdict(before) == 'not cached'
  assert events.backend_s(before) > 0
