"""A run saved with its rows split over the 'sequence' mesh axis resumes
with another split, and ends where one never split nor stopped ends."""

import jax
import numpy as np
import pytest

from jax_transformer.cli import load_config
from jax_transformer.model.params import split
from jax_transformer.train import trainer
from jax_transformer.workdirs import restore


def _train(workdir, data_dir, num_steps, **mesh):
  """Trains lm_shakespeare:tiny (rows of 32) to num_steps on mesh; returns
  the last loss and the saved parameters."""
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = data_dir
  cfg.sample.enabled = False
  cfg.model.dropout_rate = 0.0
  cfg.mesh.update({'data': 1, **mesh})
  cfg.update(num_steps=num_steps, log_every=3, eval_every=3,
             checkpoint_every=3)
  last = trainer.train_and_evaluate(cfg, str(workdir))
  model, _ = restore.load_for_inference(str(workdir))
  return last['loss'], jax.device_get(split(model)[1])


@pytest.mark.slow
def test_a_run_saved_at_one_sequence_size_resumes_at_another(
    tmp_path, fake_data_dir, capfd):
  straight = _train(tmp_path / 'straight', fake_data_dir, 6, data=8)
  _train(tmp_path / 'split', fake_data_dir, 3, data=4, sequence=2)
  assert "'sequence': 2" in capfd.readouterr().out
  resumed = _train(tmp_path / 'split', fake_data_dir, 6, data=2, sequence=4)
  out = capfd.readouterr().out
  assert 'Resumed from step 3' in out and "'sequence': 4" in out, out
  np.testing.assert_allclose(resumed[0], straight[0], rtol=1e-5)
  assert set(resumed[1]) == set(straight[1])
  for name, value in straight[1].items():
    np.testing.assert_allclose(resumed[1][name], value, rtol=1e-4,
                               atol=1e-5, err_msg=name)
