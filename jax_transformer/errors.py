"""The one exception type for bad input.

A ``UsageError`` means the caller asked for something that cannot be done
(a config that cannot run, a workdir without checkpoints, ids outside the
vocabulary): its message is one sentence saying what is wrong and what to
do. The command-line entry points print that sentence and exit with status
2 (``jax_transformer.cli``); every other exception is a bug or an
environment failure and keeps its traceback.

It subclasses ValueError so that code catching ValueError, as the library's
callers did before this type existed, still catches it.
"""


class UsageError(ValueError):
  """Bad input: the message is one sentence the user can act on."""
