"""A gs:// location's bucket asked about once, with a failure told in one
sentence naming its cause (runtime/buckets.py): against the GCS server of
the tests (tests/gcs_server.py), a closed port, and the answers GCS gives
that no server here gives (401, 403)."""

import time

import pytest

from jax_transformer.errors import UsageError
from jax_transformer.runtime import buckets, storage


def test_a_missing_bucket_on_the_gcs_server_is_no_such_bucket(gcs):
  with pytest.raises(UsageError) as err:
    storage.check_reachable('gs://no-such-bucket-xyz/run')
  host = gcs.url.split('://', 1)[1]
  assert str(err.value).startswith(
      '--workdir gs://no-such-bucket-xyz/run: no such bucket '
      f'no-such-bucket-xyz at {host}; create it (gcloud storage buckets '
      'create gs://no-such-bucket-xyz)')
  assert '\n' not in str(err.value)
  assert 'no-such-bucket-xyz' not in gcs.buckets()  # nor was it made


def test_a_bucket_of_the_gcs_server_answers(gcs, gcs_bucket):
  # A folder not there yet is the command's to judge (a new run's workdir).
  storage.check_reachable(f'gs://{gcs_bucket}/not/there/yet', '--out')
  storage.check_reachable(f'gs://{gcs_bucket}')


def test_no_network_is_one_sentence_naming_the_endpoint(monkeypatch):
  monkeypatch.setenv(buckets.EMULATOR_VARIABLE, '127.0.0.1:1')  # closed
  with pytest.raises(UsageError, match=r'^--workdir gs://b-1/run: cannot '
                     r'reach the bucket b-1: no network connection to '
                     r'127\.0\.0\.1:1; connect this machine'):
    storage.check_reachable('gs://b-1/run')


def test_answers_no_server_here_gives_are_told_by_cause():
  def told(**answer):
    return buckets.cause(buckets.Answer(**answer), 'b', buckets.GCS_URL)

  assert told(status=200) is None
  assert told(status=401, no_credentials='none found') == (
      'the bucket b needs Google credentials and this machine has none '
      f'(none found); run {buckets.LOGIN}')
  assert told(status=403).startswith('no permission to list the bucket b ')
  assert told(status=404).startswith('no such bucket b at '
                                     'storage.googleapis.com;')
  # A server's own failure is for the filesystem to retry, not a refusal.
  assert told(status=503) is None
  assert told(error=ValueError('a bug of ours')) is None
  assert told(error=TimeoutError('no answer in 8 s'),
              no_credentials='none found').endswith(
                  'no network connection to storage.googleapis.com, and '
                  'this machine has no Google credentials either (run '
                  f'{buckets.LOGIN}); connect this machine, or keep the run '
                  'on a local path')


def test_the_endpoint_is_the_one_gcsfs_and_google_cloud_storage_use(
    monkeypatch):
  monkeypatch.delenv(buckets.EMULATOR_VARIABLE, raising=False)
  assert buckets.endpoint() == 'https://storage.googleapis.com'
  monkeypatch.setenv(buckets.EMULATOR_VARIABLE, 'localhost:4443')
  assert buckets.endpoint() == 'http://localhost:4443'
  monkeypatch.setenv(buckets.EMULATOR_VARIABLE, 'https://gcs.test/')
  assert buckets.endpoint() == 'https://gcs.test'
  assert buckets.split('gs://b/a/run/') == ('b', 'a/run/')
  assert buckets.split('gs://b') == ('b', '')


def test_a_silent_search_for_credentials_is_told_as_no_credentials(
    monkeypatch):
  """Off Google Cloud, google-auth may wait seconds for a metadata server
  that never answers: the check gives up and says credentials are what is
  missing, not the network."""
  def silent():
    time.sleep(2)
    raise AssertionError('given up on before this')

  monkeypatch.setattr(buckets, '_session', silent)
  answer = buckets.ask_within(buckets.GCS_URL, 'b', 'run/', 0.2)
  assert isinstance(answer.error, buckets.NoCredentialsInTime)
  assert buckets.cause(answer, 'b', buckets.GCS_URL) == (
      'no Google credentials were found to read the bucket b (none in 0.2 '
      f's of looking, the metadata server silent); run {buckets.LOGIN}')
