"""A gs:// workdir whose bucket cannot be reached, as a new user meets it:
train.py and the scripts, run as users run them, refuse it in one line
naming the bucket and the cause, exit status 2, instead of the
filesystem's minute of retries and tracebacks (runtime/buckets.py).

Without credentials, this machine's answer depends on its network: none
(CI's machines), the bucket not there, or a sign-in wanted (GCS asked
anonymously, or no metadata server answering the search for credentials).
Each is one of the causes a user can mend."""

import os
import subprocess
import sys

import pytest
import repo

NOWHERE = 'gs://no-such-bucket-xyz/run'
CAUSES = ('cannot reach the bucket no-such-bucket-xyz: no network',
          'no such bucket no-such-bucket-xyz',
          'the bucket no-such-bucket-xyz needs Google credentials',
          'no Google credentials were found to read the bucket '
          'no-such-bucket-xyz')
DOORS = {
    'train.py': ['train.py', '--workdir', NOWHERE],
    'evaluate.py': ['scripts/evaluate.py', '--workdir', NOWHERE],
    'generate.py': ['scripts/generate.py', '--workdir', NOWHERE,
                    '--input', 'ROMEO:'],
    'export.py': ['scripts/export.py', '--workdir', NOWHERE, '--format',
                  'safetensors', '--out', 'x.safetensors'],
}


def run(argv, env):
  """(exit status, stdout, stderr) of the command run from the root."""
  done = subprocess.run(
      [sys.executable, *argv], cwd=repo.ROOT, capture_output=True, text=True,
      timeout=300, env=dict(env, JAX_PLATFORMS='cpu', TPU_SKIP_MDS_QUERY='1'))
  return done.returncode, done.stdout, done.stderr


@pytest.fixture
def no_credentials(tmp_path):
  """os.environ without any credentials or GCS server: no key file, an
  empty gcloud configuration, no metadata server."""
  closed = '127.0.0.1:1'
  env = {k: v for k, v in os.environ.items()
         if k not in ('GOOGLE_APPLICATION_CREDENTIALS',
                      'STORAGE_EMULATOR_HOST', 'TENSORSTORE_GCS_HTTP_URL',
                      'GOOGLE_AUTH_TOKEN_FOR_TESTING')}
  env.update(CLOUDSDK_CONFIG=str(tmp_path), GCE_METADATA_HOST=closed,
             GCE_METADATA_IP=closed, NO_GCE_CHECK='True')
  return env


@pytest.mark.parametrize('door', sorted(DOORS))
def test_a_bucket_out_of_reach_is_one_line_and_exit_2(door, no_credentials):
  code, out, err = run(DOORS[door], no_credentials)
  assert code == 2, err[-3000:]
  assert err.count('\n') == 1, err[-3000:]
  assert err.startswith(f'{door}: error: --workdir {NOWHERE}: '), err
  assert any(cause in err for cause in CAUSES), err
  assert not os.path.exists(os.path.join(repo.ROOT, 'x.safetensors'))


def test_train_py_names_a_bucket_missing_from_the_gcs_server(gcs):
  code, _, err = run(DOORS['train.py'], os.environ)
  host = gcs.url.split('://', 1)[1]
  assert code == 2, err[-3000:]
  assert err == (f'train.py: error: --workdir {NOWHERE}: no such bucket '
                 f'no-such-bucket-xyz at {host}; create it (gcloud storage '
                 'buckets create gs://no-such-bucket-xyz) or correct the '
                 'name.\n')
  assert 'no-such-bucket-xyz' not in gcs.buckets()
