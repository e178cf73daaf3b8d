"""A recipe's defaults on other data or another model (issue 38): the
sample of a run on your files starts from one of its validation documents,
not the recipe's 'ROMEO:', and a recipe's seq_len longer than a
pretrained model's context is lowered to it in one line (one given on the
command line is refused naming the figure)."""

import pytest

from jax_transformer import data
from jax_transformer.cli import load_config
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.train import evaluating, init_from, recipes


@pytest.mark.parametrize('given,recipe_name,emptied', [
    ({'data.name', 'data.train_files'}, 'shakespeare', True),
    ({'data.name', 'sample.prompt'}, 'shakespeare', False),
    ({'num_steps'}, 'shakespeare', False),
    ({'data.name'}, 'files', False),  # the recipe's own dataset
])
def test_the_recipes_prompt_is_dropped_for_other_data(given, recipe_name,
                                                      emptied):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.name = 'files'
  recipe = load_config('lm_shakespeare:tiny')
  recipe.data.name = recipe_name
  recipes.prompt_for_own_data(cfg, given, lambda: recipe)
  assert cfg.sample.prompt == ('' if emptied else 'ROMEO:')


def test_an_empty_prompt_is_the_start_of_a_validation_document(tmp_path):
  line = 'the cat sat on the mat and then it ran far away'
  docs = [f'{line} {i}.\nsecond line' for i in range(20)]
  for i, d in enumerate(docs):
    (tmp_path / f'{i:02d}.txt').write_text(d)
  cfg = Experiment.of(load_config('lm_shakespeare:tiny')).replace(**{
      'data.name': 'files', 'data.train_files': str(tmp_path / '*.txt'),
      'data.data_dir': str(tmp_path / 'tfds'), 'sample.prompt': ''})
  data.prepare_for(cfg.data)
  assert evaluating.data_prompt(cfg.evaluation) == (
      'the cat sat on the mat and then it ran')
  assert evaluating.data_prompt(cfg.replace(**{
      'data.train_files': str(tmp_path / 'none*.txt')}).evaluation) == ''


def llama_instruct():
  return Experiment.of(load_config('finetune:llama_instruct'))


def test_a_recipes_seq_len_is_lowered_to_the_models_context(capsys):
  cfg = init_from.apply_fields(llama_instruct(), 'runs/llama_hf',
                               'decoder_lm', {'max_len': 128}, set())
  assert cfg.seq_len == 128 and cfg.model.max_len == 128
  assert capsys.readouterr().out == (
      'config.seq_len lowered from 512 to 128: the context of the model of '
      'config.init_from=runs/llama_hf (model.max_len).\n')
  cfg.model_config(300)  # no longer refused
  again = init_from.apply_fields(llama_instruct(), 'runs/llama_hf',
                                 'decoder_lm', {'max_len': 4096}, set())
  assert again.seq_len == 512


def test_a_seq_len_given_longer_than_the_context_names_the_figure():
  with pytest.raises(UsageError) as e:
    init_from.apply_fields(llama_instruct(), 'runs/llama_hf', 'decoder_lm',
                           {'max_len': 128}, {'seq_len'})
  assert str(e.value) == (
      'config.seq_len=512 exceeds the context of the model of '
      'config.init_from=runs/llama_hf: model.max_len=128, the checkpoint\'s; '
      'lower --config.seq_len to 128 or less.')
