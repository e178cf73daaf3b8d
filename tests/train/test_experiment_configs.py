"""Every experiment config builds and loads by name or path from anywhere;
wmt_base is the paper's setting; model defaults have one home."""

import ast
import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest
import repo

from jax_transformer import cli
from jax_transformer.cli import load_config
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.model.config import ModelConfig
from jax_transformer.train import model_setup, recipes

ROOT = pathlib.Path(repo.ROOT)
CONFIGS = [('lm_shakespeare', None), ('lm_shakespeare', 'tiny'),
           ('translate_ende', None), ('translate_ende', 'tiny'),
           ('translate_ende', 'cpu30'),
           ('wmt_base', None), ('wmt_base', 'big'),
           ('gpt2_small', None), ('gpt2_small', 'shakespeare'),
           ('lm_350m', None), ('lm_1_3b', None), ('lm_7b', None),
           ('finetune', 'gpt2_shakespeare'), ('finetune', 'llama_instruct'),
           ('finetune', 'tiny'),
           pytest.param('lm_70b', None, marks=pytest.mark.slow)]


# Building lm_70b's 80-layer model took about a minute (the abstract build
# grows faster than linearly in the layer count) and exercises the same
# code path as lm_7b's 32 scanned layers: its shape fields are checked as
# written, then it is built with 2 of its layers, every other field as is.
SHALLOW_BUILD = {'lm_70b': dict(num_decoder_layers=80, d_model=8192,
                                num_heads=64, num_kv_heads=8, d_ff=28672,
                                scan_layers=True)}


@pytest.mark.parametrize('name, preset', CONFIGS)
def test_config_builds_model_and_optimizer(name, preset):
  cfg = load_config(f'{name}:{preset}' if preset else name)
  if name in SHALLOW_BUILD:
    for field, value in SHALLOW_BUILD[name].items():
      assert cfg.model[field] == value, field
    cfg.model.num_decoder_layers = 2
  setup = model_setup.build(Experiment.of(cfg), 8000)
  assert setup.model_config.vocab_size % cfg.vocab_multiple == 0
  assert cfg.batch_size % 8 == 0


def test_every_file_in_configs_is_listed_and_imports_only_the_package():
  files = sorted(p.stem for p in (ROOT / 'configs').glob('*.py'))
  assert cli.config_names() == files
  names = {(c.values if hasattr(c, 'values') else c)[0] for c in CONFIGS}
  assert names == set(files)
  for name in files:
    tree = ast.parse((ROOT / 'configs' / f'{name}.py').read_text())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        assert node.module.split('.')[0] in ('jax_transformer',
                                             'ml_collections'), name
      elif isinstance(node, ast.Import):
        assert all(a.name.split('.')[0] == 'ml_collections'
                   for a in node.names), name


def test_a_name_and_a_path_load_the_same_config_from_any_directory(tmp_path):
  by_path = load_config('configs/lm_shakespeare.py:tiny')
  assert by_path == load_config('lm_shakespeare:tiny')
  # From another working directory, in a fresh interpreter: no sys.path
  # entry for the checkout is needed.
  code = ('from jax_transformer.cli import load_config; '
          'print(load_config("translate_ende:tiny").data.name)')
  out = subprocess.run([sys.executable, '-c', code], cwd=tmp_path,
                       capture_output=True, text=True, check=True,
                       env={k: v for k, v in os.environ.items()
                            if k != 'PYTHONPATH'})
  assert out.stdout.strip() == 'ding_en_de'


def test_unknown_names_and_files_are_one_sentence():
  with pytest.raises(UsageError, match='did you mean lm_shakespeare'):
    load_config('lm_shakespear')
  with pytest.raises(UsageError, match='the file does not exist'):
    load_config('configs/nope.py')


def test_model_defaults_come_from_model_config():
  """A recipe names only what it changes: every other field of
  config.model is ModelConfig's default."""
  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  paper = recipes.paper_model().to_dict()
  assert set(paper) == set(defaults)
  assert {k: v for k, v in paper.items() if k not in ('vocab_size',)} == {
      k: v for k, v in defaults.items() if k != 'vocab_size'}
  assert paper['vocab_size'] is None  # the tokenizer's
  small = recipes.model_fields(recipes.small_lm).to_dict()
  assert small == {**dataclasses.asdict(recipes.small_lm()),
                   'vocab_size': None, 'num_kv_heads': None}


def test_a_bad_recipe_value_fails_when_the_config_loads():
  with pytest.raises(UsageError, match='num_heads'):
    recipes.model_fields(recipes.small_lm, d_model=30, num_heads=4)


def test_wmt_base_is_the_paper():
  cfg = load_config('wmt_base')
  setup = model_setup.build(Experiment.of(cfg), 37000)
  assert sum(x.size for x in setup.abstract_params.values()) == 63_084_544
  assert cfg.data.direction == 'en-de'
  assert (cfg.optim.warmup_steps, cfg.optim.label_smoothing) == (4000, 0.1)
  assert (cfg.optim.b1, cfg.optim.b2, cfg.optim.eps) == (0.9, 0.98, 1e-9)
  # Step 4000 is the peak: 512^-0.5 * 4000^-0.5.
  assert float(setup.schedule(3999)) == pytest.approx(7.0e-4, rel=1e-2)


def test_unknown_preset_and_field_are_refused():
  with pytest.raises(UsageError, match='Unknown preset'):
    load_config('lm_shakespeare:huge')
  cfg = load_config('lm_shakespeare')
  cfg.model.unlock()
  cfg.model.n_layers = 3
  with pytest.raises(ValueError, match="config.model has no field 'n_layers'"):
    model_setup.build(Experiment.of(cfg), 300)
