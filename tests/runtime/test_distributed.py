"""distributed.py in one process: the bounds, what initialize passes to JAX,
and the barrier's error, with JAX's runtime stood in for."""

import ast
import math
import os
import threading

import jax
import ml_collections
import pytest
import repo
from jax._src import distributed as jax_distributed

from jax_transformer.runtime import distributed, liveness
from jax_transformer.runtime.distributed import Timeouts
from jax_transformer.train import trainer


@pytest.fixture(autouse=True)
def restore_state(monkeypatch):
  """initialize sets this module's bounds and a JAX config option."""
  monkeypatch.setattr(distributed, '_timeouts', distributed._timeouts)
  collectives = jax.config.jax_cpu_collectives_implementation
  yield
  jax.config.update('jax_cpu_collectives_implementation', collectives)


@pytest.mark.parametrize('value', [0, -1, math.nan, math.inf, True, '60'])
def test_a_bound_must_be_a_positive_number_of_seconds(value):
  with pytest.raises(ValueError, match=r'^--heartbeat_timeout must be a '
                     'positive number of seconds'):
    Timeouts(heartbeat=value)


def test_jax_heartbeat_outlasts_the_watchdog():
  """The watchdog decides within timeout + one interval (timeout / 6) of a
  death; JAX notices no sooner than half its own timeout."""
  for heartbeat in (1, 5, 60, 600):
    bounds = Timeouts(heartbeat=heartbeat)
    assert bounds.jax_heartbeat() / 2 > heartbeat * 7 / 6


def test_train_py_flag_defaults_are_the_timeouts_defaults():
  """train.py cannot import the package before parsing flags (--help stays
  fast), so its defaults are written there too: they must agree."""
  with open(os.path.join(repo.ROOT, 'train.py')) as f:
    tree = ast.parse(f.read())
  defaults = {}
  for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and getattr(node.func, 'attr', '')
        == 'DEFINE_float' and node.args[0].value.endswith('_timeout')):
      name = node.args[0].value[:-len('_timeout')]
      defaults[name] = eval(compile(ast.Expression(node.args[1]), 'train.py',
                                    'eval'), {})
  assert defaults == {f: getattr(Timeouts(), f)
                      for f in Timeouts.__dataclass_fields__}


def test_one_process_without_a_cluster_does_not_start_jax_distributed(
    monkeypatch):
  monkeypatch.setattr(jax.distributed, 'initialize',
                      lambda *a, **k: pytest.fail('initialized'))
  distributed.initialize(bounds=Timeouts(heartbeat=7))
  assert distributed._timeouts.heartbeat == 7
  distributed.barrier('anything')  # nothing to wait for


def test_initialize_passes_the_bounds_to_jax(monkeypatch):
  calls = []
  monkeypatch.setattr(jax.distributed, 'initialize',
                      lambda *a, **k: calls.append((a, k)))
  distributed.initialize('127.0.0.1:1234', 2, 1, Timeouts(
      init=100, heartbeat=20, barrier=45.5))
  assert calls == [(('127.0.0.1:1234', 2, 1), {
      'local_device_ids': None, 'cluster_detection_method': 'deactivate',
      'initialization_timeout': 130, 'heartbeat_timeout_seconds': 70,
      'shutdown_timeout_seconds': 46})]


def test_a_job_not_joined_in_time_ends_with_one_sentence(monkeypatch):
  said = threading.Event()
  messages = []

  def exit_now(message):
    messages.append(message)
    said.set()

  # JAX's initialize blocks until every process connects: here, never.
  monkeypatch.setattr(jax.distributed, 'initialize',
                      lambda *a, **k: said.wait(30))
  monkeypatch.setattr(liveness, 'exit_now', exit_now)
  distributed.initialize('10.0.0.1:8476', 4, 3, Timeouts(init=0.2))
  assert messages == [
      'Not every process joined the job within 0.2 s (--init_timeout), so '
      'process 3 of 4 stops: check that all of them started, with the same '
      '--num_processes, and can reach the coordinator at 10.0.0.1:8476.']


class FakeClient:
  """JAX's distributed runtime client: barriers fail with error if given;
  the key-value store is a dict, and a missing key times out."""

  def __init__(self, error=None):
    self.error, self.calls, self.values = error, [], {}

  def wait_at_barrier(self, name, timeout_in_ms):
    self.calls.append((name, timeout_in_ms))
    if self.error:
      raise self.error

  def key_value_set(self, key, value):
    assert key not in self.values
    self.values[key] = value

  def blocking_key_value_get(self, key, timeout_in_ms):
    self.calls.append((key, timeout_in_ms))
    if key not in self.values:
      raise jax.errors.JaxRuntimeError(
          f'DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}')
    return self.values[key]


@pytest.fixture
def two_processes(monkeypatch):
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 1)

  def with_client(client):
    monkeypatch.setattr(jax_distributed.global_state, 'client', client)
    return client
  return with_client


def test_barriers_wait_as_long_as_their_kind_allows(two_processes):
  client = two_processes(FakeClient())
  distributed._timeouts = Timeouts(barrier=12, data=3600)
  distributed.barrier('workdir read')
  distributed.barrier('data prepared', kind='data')
  assert client.calls == [('workdir read', 12_000),
                          ('data prepared', 3_600_000)]


def test_a_barrier_past_its_bound_names_itself_and_the_flag(two_processes):
  two_processes(FakeClient(jax.errors.JaxRuntimeError(
      'DEADLINE_EXCEEDED: Barrier timed out. Id: data prepared::0.')))
  distributed._timeouts = Timeouts(data=5400)
  with pytest.raises(TimeoutError) as err:
    distributed.barrier('data prepared', kind='data')
  assert str(err.value) == (
      "Not every process reached the barrier 'data prepared' within 5400 s "
      '(--data_timeout), so process 1 of 2 stops: the others\' logs say '
      'where they are.')


def test_other_barrier_failures_pass_through(two_processes):
  error = jax.errors.JaxRuntimeError('UNAVAILABLE: Socket closed')
  two_processes(FakeClient(error))
  with pytest.raises(jax.errors.JaxRuntimeError) as err:
    distributed.barrier('workdir read')
  assert err.value is error


def test_a_message_is_received_or_its_wait_names_the_flag(two_processes):
  client = two_processes(FakeClient())
  distributed._timeouts = Timeouts(barrier=2)
  distributed.send('greeting', 'hello')
  assert distributed.receive('greeting') == 'hello'
  with pytest.raises(TimeoutError) as err:
    distributed.receive('never sent')
  assert str(err.value) == (
      "No process sent 'never sent' within 2 s (--barrier_timeout), so "
      "process 1 of 2 stops: the sender's log says why.")
  assert client.calls[-1] == ('jax_transformer/message/never sent', 2000)


@pytest.fixture
def prepare_as(two_processes, monkeypatch):
  """trainer.prepare_data as one process of two sharing a fake store;
  the preparation (data.prepare_for, the run's data door) fails
  with the error given, if any."""
  client = two_processes(FakeClient())

  def run(process, error=None):
    def prepare(*args, **kwargs):
      if error:
        raise error
      return f'prepared by {process}'
    monkeypatch.setattr(jax, 'process_index', lambda: process)
    monkeypatch.setattr(trainer.data, 'prepare_for', prepare)
    return trainer.prepare_data(ml_collections.ConfigDict(
        {'seq_len': 8, 'data': {'name': 'shakespeare'}}))
  return client, run


def test_others_load_the_data_after_process_0_prepared_it(prepare_as):
  client, run = prepare_as
  assert run(0) == 'prepared by 0'
  assert run(1) == 'prepared by 1'
  assert client.calls == [('jax_transformer/message/data prepared',
                           6 * 3600 * 1000)]
  assert client.values == {'jax_transformer/message/data prepared': 'ok'}


def test_others_stop_at_once_when_process_0_cannot_prepare_the_data(
    prepare_as):
  client, run = prepare_as
  with pytest.raises(OSError):
    run(0, OSError('No space left on device\nwhile writing shard 3'))
  with pytest.raises(RuntimeError) as err:
    run(1)
  assert str(err.value) == (
      'Process 0 could not prepare the dataset (OSError: No space left on '
      'device), so process 1 stops too.')
  assert len(client.calls) == 1


def test_all_processes_stop_when_one_fails_its_own_check(two_processes,
                                                         monkeypatch):
  client = two_processes(FakeClient())
  monkeypatch.setattr(jax, 'process_index', lambda: 0)
  distributed.all_passed('workdir writable',
                         'gs://bucket/run is not writable: 403 Forbidden.')
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  with pytest.raises(RuntimeError) as err:
    distributed.all_passed('workdir writable')
  assert str(err.value) == (
      "Process 0 failed 'workdir writable' (gs://bucket/run is not writable: "
      '403 Forbidden.), so process 1 of 2 stops too.')
  assert client.values['jax_transformer/message/workdir writable/1'] == 'ok'


def test_all_processes_go_on_when_every_check_passed(two_processes):
  client = two_processes(FakeClient())
  client.values['jax_transformer/message/disk space/0'] = 'ok'  # process 0
  distributed.all_passed('disk space')  # as process 1: returns
  assert client.calls == [('jax_transformer/message/disk space/0', 300_000)]
