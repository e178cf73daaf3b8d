"""The error a user can act on: bad configuration or bad input.

Raised with one sentence saying what is wrong and what to do. Command-line
entry points print it on one line and exit with status 2
(``jax_transformer.cli``); any other exception keeps its traceback, since
it is a bug. A subclass of ValueError, so callers catching ValueError keep
working.
"""


class UsageError(ValueError):
  """Bad configuration or input, explained in one sentence."""


def first_line(error: BaseException) -> str:
  """The first line of error's message ('' for none): what a one-sentence
  refusal quotes of an underlying failure."""
  return (str(error).strip().splitlines() or [''])[0]


def named_line(error: BaseException) -> str:
  """'Type: first line' of error, e.g. 'JSONDecodeError: Expecting value':
  how a refusal names the failure under it."""
  return f'{type(error).__name__}: {first_line(error)}'
