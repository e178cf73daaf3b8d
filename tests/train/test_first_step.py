"""The restart-to-first-step line: its parts add up, the benchmark reads
it back, and JAX's compilation-cache events decide hit or miss."""

import subprocess
import time

import jax
import jax.numpy as jnp
import repo
from train_runs import train_command, train_env

from jax_transformer import data
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


def test_start_up_is_counted_from_when_python_starts_not_the_shell(
    tmp_path, real_data_dir):
  """A shell that sleeps, then execs train.py (as `sleep 5 && exec python
  ...` or a launch script's last line): the process is the shell's, forked
  before the sleep, and the first-step line must not count the sleep. The
  shell prints its clock just before the exec; the line's 'after the
  process started' cannot exceed the seconds from then to the exit."""
  data.prepare('shakespeare', real_data_dir)
  flags = ['--config.num_steps=1', '--config.log_every=1',
           '--config.eval_every=1', '--config.checkpoint_every=1']
  command = subprocess.list2cmdline(train_command(
      tmp_path / 'w', real_data_dir, *flags))
  shell = f'sleep 5 && date +%s.%N && exec {command}'
  out = subprocess.run(['bash', '-c', shell], env=train_env(), cwd=repo.ROOT,
                       capture_output=True, text=True, timeout=600,
                       check=True).stdout
  exited = time.time()
  before_exec = float(out.split('\n', 1)[0])
  line = first_step.parse(out)
  assert line is not None, out[-2000:]
  assert 0 < line['to_first_step_s'] <= exited - before_exec
