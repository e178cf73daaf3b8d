"""A first start of train.py that stops before keeping anything (refused
after config.json and tokenizer/ were written, or failed) leaves the
workdir as it found it: no config.json that a rerun with other model
fields would have to match; what was there before stays."""

import os

import pytest

from jax_transformer.cli import load_config
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.train import perf, trainer


@pytest.fixture
def refused_at_compile(monkeypatch):
  """A refusal where the step is compiled (as the compiled step's memory
  is refused), after the side files are written."""
  def refuse(*args):
    raise UsageError('The compiled train step needs more than the device '
                     'has.')
  monkeypatch.setattr(perf, 'compile_timed', refuse)


def test_a_refused_first_start_leaves_the_workdir_as_it_was(
    tmp_path, refused_at_compile):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = str(tmp_path / 'tfds')
  cfg.sample.enabled = False
  new = tmp_path / 'runs' / 'new'
  with pytest.raises(UsageError, match='compiled train step'):
    trainer.train_and_evaluate(cfg, str(new))
  assert os.listdir(tmp_path / 'runs') == []  # the folder made is removed

  held = tmp_path / 'held'
  held.mkdir()
  (held / 'notes.txt').write_text('mine')
  with pytest.raises(UsageError, match='compiled train step'):
    trainer.train_and_evaluate(cfg, str(held))
  assert os.listdir(held) == ['notes.txt']
  # A rerun with another model is a new run, not a mismatch.
  cfg.model.d_model = 48
  trainer.check_resumable(Experiment.of(cfg), str(held))
