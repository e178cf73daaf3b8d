"""config.data.spm_model_type picks the SentencePiece algorithm: 'bpe' or
'unigram' as trained and saved, anything else refused up front; a resumed
workdir keeps the tokenizer it was trained with."""

import json
import os
import shutil

import pytest
from sentencepiece import sentencepiece_model_pb2

from jax_transformer import data
from jax_transformer.cli import load_config
from jax_transformer.data import testing as data_testing
from jax_transformer.runtime import workdir as workdir_lib
from jax_transformer.train import trainer

SPEC = sentencepiece_model_pb2.TrainerSpec
CONFIGS = ('lm_shakespeare', 'translate_ende', 'wmt_base', 'gpt2_small',
           'lm_350m', 'lm_1_3b')


@pytest.fixture(scope='module')
def ding(tmp_path_factory):
  return data_testing.write_fake_ding(tmp_path_factory.mktemp('src') / 'de')


def model_type(tokenizer_dir) -> int:
  """The trainer_spec.model_type saved in a tokenizer directory."""
  proto = sentencepiece_model_pb2.ModelProto()
  with open(os.path.join(tokenizer_dir, 'spm.model'), 'rb') as f:
    proto.ParseFromString(f.read())
  return proto.trainer_spec.model_type


@pytest.mark.parametrize('name', CONFIGS)
def test_every_config_names_a_valid_model_type(name):
  cfg = load_config(name)
  assert cfg.data.spm_model_type in ('unigram', 'bpe')


def test_wmt_base_uses_bpe_as_its_docstring_says():
  cfg = load_config('wmt_base')
  assert cfg.data.spm_model_type == 'bpe'


@pytest.mark.parametrize('kind, want', [('bpe', SPEC.BPE),
                                        ('unigram', SPEC.UNIGRAM)])
def test_prepare_trains_the_model_type_asked_for(tmp_path, ding, kind, want):
  prepared = data.prepare('ding_en_de', str(tmp_path), vocab_size=500,
                          model_type=kind,
                          builder_kwargs={'source_path': ding})
  name = os.path.basename(prepared.tokenizer_dir)
  assert name == f'tokenizer_spm_{kind}_500'
  assert model_type(prepared.tokenizer_dir) == want


def test_an_unknown_model_type_is_refused_before_building(tmp_path, ding):
  with pytest.raises(ValueError, match=r"data.spm_model_type\) must be "
                     r"'unigram' or 'bpe', got 'word'\."):
    data.prepare('ding_en_de', str(tmp_path / 'tfds'), model_type='word',
                 builder_kwargs={'source_path': ding})
  assert not os.path.exists(tmp_path / 'tfds')


@pytest.mark.slow
def test_a_resumed_workdir_keeps_its_bpe_tokenizer(tmp_path, ding):
  data_dir, workdir = str(tmp_path / 'tfds'), str(tmp_path / 'run')

  def prepare(kind):
    return data.prepare('ding_en_de', data_dir, vocab_size=500,
                        model_type=kind, builder_kwargs={'source_path': ding})

  shared = prepare('bpe').tokenizer_dir
  cfg = load_config('translate_ende:tiny')
  cfg.data.update(data_dir=data_dir, vocab_size=500, spm_model_type='bpe')
  cfg.update(num_steps=1, eval_bleu_examples=0)
  cfg.sample.enabled = False
  trainer.train_and_evaluate(cfg, workdir)
  saved = os.path.join(workdir, workdir_lib.TOKENIZER_DIR)
  assert model_type(saved) == SPEC.BPE
  with open(os.path.join(saved, 'spm.model'), 'rb') as f:
    first = f.read()
  # The data directory's tokenizer is replaced by a unigram one with fewer
  # pieces (fewer than the padding to vocab_multiple makes up): resuming
  # with it instead of the workdir's own would build a smaller model than
  # the checkpoint holds.
  unigram = prepare('unigram')
  assert (unigram.vocab_size
          <= prepare('bpe').vocab_size - cfg.vocab_multiple)
  shutil.rmtree(shared)
  shutil.copytree(unigram.tokenizer_dir, shared)
  assert model_type(shared) == SPEC.UNIGRAM
  cfg.num_steps = 2
  trainer.train_and_evaluate(cfg, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    # Each start's rows, then its last row again with the start's times.
    assert [json.loads(row)['step'] for row in f] == [1, 1, 2, 2]
  with open(os.path.join(saved, 'spm.model'), 'rb') as f:
    assert f.read() == first
