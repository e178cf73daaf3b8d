"""Whether a gs:// bucket answers, asked once before a command's work.

gcsfs, which reads and writes a gs:// workdir, retries a request it cannot
send for about 50 s and logs every attempt with its traceback: a run on a
machine without network or credentials used to print some 200 lines before
failing. The doors (train.py and the scripts) ask here first with
:func:`check`: one listing of the bucket, short timeouts, no retry, and a
failure told in one sentence naming its cause: no network, no credentials,
no such bucket, no permission.

The request goes where gcsfs and google-cloud-storage send theirs:
``STORAGE_EMULATOR_HOST`` where it is set (a GCS server such as the tests',
asked without credentials, as those clients ask it), storage.googleapis.com
otherwise, with the machine's Application Default Credentials where it has
any and anonymously where not (a public bucket still reads).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import urllib.parse

from jax_transformer.errors import UsageError, first_line

GCS_URL = 'https://storage.googleapis.com'
EMULATOR_VARIABLE = 'STORAGE_EMULATOR_HOST'
# The whole question (credentials, name lookup, the request) takes at most
# this long: a refusal comes well within 15 s of the command's start.
TIMEOUT_S = 8.0
# Listing objects is what a workdir's reader needs anyway; a bucket's own
# metadata would need a permission many users of a bucket lack.
READ_SCOPE = 'https://www.googleapis.com/auth/devstorage.read_only'
LOGIN = ('gcloud auth application-default login, or set '
         'GOOGLE_APPLICATION_CREDENTIALS')

_ANSWERED: set[tuple[str, str]] = set()  # (endpoint, bucket) that answered


class NoCredentialsInTime(TimeoutError):
  """The search for credentials (google-auth asks for a metadata server,
  which off Google Cloud may not answer for seconds) outlasted the check."""


@dataclasses.dataclass(frozen=True)
class Answer:
  """What asking about a bucket got.

  Attributes:
    status: the HTTP status of the listing; None where none came.
    error: why none came (an exception), or None.
    no_credentials: why no credentials were sent ('' where some were, or
      none are needed: a GCS server such as the tests').
  """
  status: int | None = None
  error: BaseException | None = None
  no_credentials: str = ''


def split(location: str | os.PathLike) -> tuple[str, str]:
  """('bucket', 'run/') for 'gs://bucket/run'."""
  rest = os.fspath(location).split('://', 1)[1]
  bucket, _, prefix = rest.partition('/')
  prefix = prefix.strip('/')
  return bucket, f'{prefix}/' if prefix else ''


def endpoint() -> str:
  """Where GCS's JSON API is asked, as gcsfs and google-cloud-storage
  choose it (a GCS server's address may come without a scheme)."""
  host = os.environ.get(EMULATOR_VARIABLE, '').strip().rstrip('/')
  if not host:
    return GCS_URL
  return host if '://' in host else f'http://{host}'


def check(location: str | os.PathLike, flag: str = '--workdir') -> None:
  """Refuses, in one sentence, a gs:// location whose bucket cannot be
  listed from here for a reason the user must mend. A bucket that
  answered once is not asked again by this process; an answer that names
  no such reason (a server error) lets the command go on."""
  bucket, prefix = split(location)
  url = endpoint()
  if (url, bucket) in _ANSWERED:
    return
  problem = cause(ask_within(url, bucket, prefix, TIMEOUT_S), bucket, url)
  if problem:
    raise UsageError(f'{flag} {os.fspath(location)}: {problem}.')
  _ANSWERED.add((url, bucket))


def cause(answer: Answer, bucket: str, url: str) -> str | None:
  """The refusal's clause for an answer, or None where there is none to
  give: the bucket answered, or failed in a way no user can mend."""
  host = urllib.parse.urlsplit(url).netloc or url
  if answer.status is not None and answer.status < 300:
    return None
  if answer.status == 404:
    return (f'no such bucket {bucket} at {host}; create it (gcloud storage '
            f'buckets create gs://{bucket}) or correct the name')
  if answer.status in (401, 403) and answer.no_credentials:
    return (f'the bucket {bucket} needs Google credentials and this machine '
            f'has none ({answer.no_credentials}); run {LOGIN}')
  if answer.status in (401, 403):
    return (f'no permission to list the bucket {bucket} with this '
            "machine's Google credentials; ask for roles/storage.objectUser "
            'on it, or choose another bucket')
  if answer.status is not None:  # a server error: the run may retry it
    return None
  return _failure(answer, bucket, host)


def _failure(answer: Answer, bucket: str, host: str) -> str | None:
  """The clause for a request that got no answer."""
  import google.auth.exceptions  # pylint: disable=g-import-not-at-top
  error = answer.error
  if isinstance(error, NoCredentialsInTime):
    return (f'no Google credentials were found to read the bucket {bucket} '
            f'({error}); run {LOGIN}')
  if isinstance(error, google.auth.exceptions.RefreshError):
    return (f'the Google credentials found here were refused while asking '
            f'for the bucket {bucket} ({first_line(error)}); run {LOGIN}')
  if not _unreachable(error):
    return None
  missing = (f', and this machine has no Google credentials either (run '
             f'{LOGIN})' if answer.no_credentials else '')
  return (f'cannot reach the bucket {bucket}: no network connection to '
          f'{host}{missing}; connect this machine, or keep the run on a '
          'local path')


def _unreachable(error: BaseException | None) -> bool:
  """Whether error says the endpoint (or the sign-in service) could not be
  reached at all: no name, no route, no answer in time."""
  import google.auth.exceptions  # pylint: disable=g-import-not-at-top
  import requests  # pylint: disable=g-import-not-at-top
  return isinstance(error, (TimeoutError, requests.ConnectionError,
                            requests.Timeout,
                            google.auth.exceptions.TransportError))


def ask_within(url: str, bucket: str, prefix: str,
               seconds: float) -> Answer:
  """ask(...), given up after seconds: a name lookup or the metadata
  server's search for credentials has no timeout of its own to trust.
  A question given up on is left to finish in a daemon thread."""
  answers: list[Answer] = []
  stages: list[str] = []
  worker = threading.Thread(
      target=lambda: answers.append(ask(url, bucket, prefix, seconds,
                                        stages)),
      name='bucket-check', daemon=True)
  worker.start()
  worker.join(seconds)
  if answers:
    return answers[0]
  if stages[-1:] == ['credentials']:
    return Answer(error=NoCredentialsInTime(
        f'none in {seconds:g} s of looking, the metadata server silent'))
  return Answer(error=TimeoutError(f'no answer in {seconds:g} s'))


def ask(url: str, bucket: str, prefix: str, seconds: float,
        stages: list[str] | None = None) -> Answer:
  """Lists at most one object of bucket under prefix; never raises.
  stages: where it has got to ('credentials', then 'request'), for a
  caller that gives up waiting."""
  import requests  # pylint: disable=g-import-not-at-top
  stages = [] if stages is None else stages
  missing = ''
  try:
    # GCS itself with this machine's credentials, a GCS server without.
    stages.append('credentials')
    session, missing = (_session() if url == GCS_URL
                        else (requests.Session(), ''))
    stages.append('request')
    with session:
      reply = session.get(
          f'{url}/storage/v1/b/{urllib.parse.quote(bucket, safe="")}/o',
          params={'maxResults': 1, 'prefix': prefix, 'fields': 'kind'},
          timeout=seconds)
  except Exception as error:  # pylint: disable=broad-except
    return Answer(error=error, no_credentials=missing)
  return Answer(status=reply.status_code, no_credentials=missing)


def _session():
  """(a requests session that signs in with this machine's Application
  Default Credentials, or an anonymous one where there are none; '' or
  why there are none)."""
  import google.auth  # pylint: disable=g-import-not-at-top
  import google.auth.exceptions  # pylint: disable=g-import-not-at-top
  import requests  # pylint: disable=g-import-not-at-top
  from google.auth.transport import requests as auth_requests  # pylint: disable=g-import-not-at-top
  try:
    credentials, _ = google.auth.default(scopes=[READ_SCOPE])
  except google.auth.exceptions.DefaultCredentialsError as error:
    # Its first sentence: the rest is a link to the sign-in guide.
    return requests.Session(), (first_line(error).split('. ')[0].rstrip('.')
                                or 'none found')
  return auth_requests.AuthorizedSession(credentials), ''
