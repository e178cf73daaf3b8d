"""Every experiment config builds; wmt_base is the paper's setting."""

import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jax_transformer import experiment  # noqa: E402

CONFIGS = [('lm_shakespeare', None), ('lm_shakespeare', 'tiny'),
           ('translate_ende', None), ('translate_ende', 'tiny'),
           ('wmt_base', None), ('wmt_base', 'big'),
           ('gpt2_small', None), ('gpt2_small', 'shakespeare')]


@pytest.mark.parametrize('name, preset', CONFIGS)
def test_config_builds_model_and_optimizer(name, preset):
  cfg = importlib.import_module(f'configs.{name}').get_config(preset)
  setup = experiment.setup(cfg, 8000)
  assert setup.model_config.vocab_size % cfg.vocab_multiple == 0
  assert cfg.batch_size % 8 == 0


def test_wmt_base_is_the_paper():
  cfg = importlib.import_module('configs.wmt_base').get_config()
  setup = experiment.setup(cfg, 37000)
  assert sum(x.size for x in setup.abstract_params.values()) == 63_084_544
  assert cfg.data.direction == 'en-de'
  assert (cfg.optim.warmup_steps, cfg.optim.label_smoothing) == (4000, 0.1)
  assert (cfg.optim.b1, cfg.optim.b2, cfg.optim.eps) == (0.9, 0.98, 1e-9)
  # Step 4000 is the peak: 512^-0.5 * 4000^-0.5.
  assert float(setup.schedule(3999)) == pytest.approx(7.0e-4, rel=1e-2)


def test_unknown_preset_and_field_are_refused():
  with pytest.raises(ValueError, match='Unknown preset'):
    importlib.import_module('configs.lm_shakespeare').get_config('huge')
  cfg = importlib.import_module('configs.lm_shakespeare').get_config()
  cfg.model.unlock()
  cfg.model.n_layers = 3
  with pytest.raises(ValueError, match=r"unknown fields \['n_layers'\]"):
    experiment.setup(cfg, 300)
