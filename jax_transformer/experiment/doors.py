"""Where an experiment enters the package, typed once.

Every function inside the package takes an :class:`Experiment` (or the
one part of it it needs); only these convert, each at one door:

* :func:`from_command_line`: the ConfigDict a config file made and the
  ``--config.a.b=value`` flags changed (train.py and every script);
* :func:`from_saved`: a workdir's ``config.json``;
* :func:`from_caller`: what a library caller hands ``train_and_evaluate``
  (an Experiment, a ConfigDict or a mapping of its fields).

A misspelt field is refused at the door in one sentence naming the
closest (``fields.build``).
"""

from __future__ import annotations

from typing import Any, Mapping

from ml_collections import ConfigDict

from jax_transformer import cli
from jax_transformer.experiment.run import Experiment


def from_command_line(config: ConfigDict) -> Experiment:
  """The experiment of a parsed ``--config`` (and its overrides)."""
  return Experiment.of(config)


def load(spec: str) -> Experiment:
  """The experiment of ``NAME[:preset]`` or ``PATH.py[:preset]`` as
  ``--config`` names it, without overrides."""
  return from_command_line(cli.load_config(spec))


def from_saved(saved: Mapping[str, Any]) -> Experiment:
  """The experiment a workdir's config.json holds (fields added since it
  was written take their defaults)."""
  return Experiment.of(dict(saved))


def from_caller(value: Experiment | ConfigDict | Mapping[str, Any]
                ) -> Experiment:
  """A library caller's experiment, typed."""
  return Experiment.of(value)
