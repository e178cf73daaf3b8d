"""data.tokenizer_path: an existing tokenizer instead of one trained on the
corpus (a SentencePiece .model, a Hugging Face tokenizer.json or a folder
holding one), with its own begin/end-of-document ids; the token store holds
its ids and is keyed by it (docs/data.md, "Your own data")."""

import json
import os

import hf_fixtures
import ml_collections
import pytest
import sentencepiece as spm
from tokenizers import Tokenizer

from jax_transformer import data
from jax_transformer.data import token_store
from jax_transformer.data import tokenizers as tok
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.train import recipes, run_plan

DOCS = [f'Document {i}: the quick brown fox {"jumps " * (i % 7)}over it.'
        for i in range(40)]


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp('corpus')
  with open(root / 'c.jsonl', 'w') as f:
    f.writelines(json.dumps({'text': d}) + '\n' for d in DOCS)
  return root


@pytest.fixture(scope='module')
def spm_path(corpus):
  return hf_fixtures.spm_model(corpus / 'my.model', DOCS)


@pytest.fixture(scope='module')
def bpe_path(corpus):
  return hf_fixtures.bpe_tokenizer_json(corpus / 'bpe' / 'tokenizer.json',
                                        DOCS)


def cfg_for(corpus, tmp_path, **fields):
  return {'name': 'files', 'train_files': str(corpus / 'c.jsonl'),
          'data_dir': str(tmp_path / 'tfds'), **fields}


def store_rows(prepared, split='train'):
  store = token_store.TokenStore(
      token_store.store_dir(prepared.data_dir, prepared.spec.home, split,
                            prepared.tokenizer), ('text',))
  source = data.load_source(prepared.spec, split, prepared.data_dir)
  return [(data.datasets.as_text(source[i]['text']), list(store[i]['text']))
          for i in range(len(source))]


def test_a_sentencepiece_model_is_used_with_its_own_ids(corpus, spm_path,
                                                        tmp_path):
  prepared = data.prepare_for(cfg_for(corpus, tmp_path,
                                      tokenizer_path=spm_path), seq_len=16)
  t = prepared.tokenizer
  assert t.kind == 'sentencepiece' and prepared.tokenizer_dir == spm_path
  # SentencePiece's own layout (Llama 2's): unk 0, bos 1, eos 2, no pad.
  assert (t.unk_id, t.bos_id, t.eos_id, t.pad_id) == (0, 1, 2, None)
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  assert t.vocab_size == sp.get_piece_size()
  rows = store_rows(prepared)
  assert len(rows) == 39
  for text, ids in rows:
    assert ids == sp.encode(text)
  assert t.decode([t.bos_id, *rows[0][1], t.eos_id]) == rows[0][0]


def test_a_tokenizer_json_is_used_with_its_special_tokens(corpus, bpe_path,
                                                          tmp_path):
  prepared = data.prepare_for(cfg_for(corpus, tmp_path,
                                      tokenizer_path=bpe_path), seq_len=8)
  t = prepared.tokenizer
  backend = Tokenizer.from_file(bpe_path)
  assert t.kind == 'huggingface'
  assert (t.bos_id, t.eos_id) == (backend.token_to_id('<s>'),
                                  backend.token_to_id('</s>')) == (0, 1)
  for text, ids in store_rows(prepared):
    assert ids == backend.encode(text, add_special_tokens=False).ids
  # The folder holding it gives the same tokenizer, and so the same store.
  again = data.prepare_for(cfg_for(corpus, tmp_path, tokenizer_path=str(
      os.path.dirname(bpe_path))))
  assert tok.fingerprint(again.tokenizer) == tok.fingerprint(t)
  assert not again.stores


def test_two_tokenizers_never_share_a_store(corpus, spm_path, bpe_path,
                                            tmp_path):
  dirs = set()
  for fields in ({}, {'tokenizer_path': spm_path},
                 {'tokenizer_path': bpe_path},
                 {'tokenizer': 'sentencepiece', 'vocab_size': 300}):
    prepared = data.prepare_for(cfg_for(corpus, tmp_path, **fields))
    assert set(prepared.stores) == {'train', 'validation'}  # its own, new
    dirs.add(token_store.store_dir(prepared.data_dir, prepared.spec.home,
                                   'train', prepared.tokenizer))
  assert len(dirs) == 4 and all(os.path.isdir(d) for d in dirs)


def test_a_folder_names_its_special_tokens_and_gpt2_style_ends(tmp_path):
  folder = tmp_path / 'hf'
  hf_fixtures.bpe_tokenizer_json(folder / 'tokenizer.json', DOCS,
                                 special_tokens=('<|endoftext|>', '<doc>',
                                                 '</doc>'))
  bare = tok.from_path(str(folder / 'tokenizer.json'))
  assert bare.bos_id == bare.eos_id == 0  # GPT-2: one token ends and begins
  (folder / 'tokenizer_config.json').write_text(json.dumps(
      {'bos_token': '<doc>', 'eos_token': {'content': '</doc>'}}))
  named = tok.from_path(str(folder))
  assert (named.bos_id, named.eos_id) == (1, 2)
  # A folder written by Tokenizer.save (a workdir's tokenizer/) too.
  tok.ByteTokenizer().save(tmp_path / 'saved')
  assert tok.from_path(str(tmp_path / 'saved')).kind == 'byte'


@pytest.mark.parametrize('make, message', [
    (lambda p: str(p / 'nothing.model'), 'no such file or folder'),
    (lambda p: (p / 'a.txt').write_text('x') and str(p / 'a.txt'),
     'not a tokenizer file'),
    (lambda p: (p / 'x.model').write_bytes(b'junk') and str(p / 'x.model'),
     'not a SentencePiece model'),
    (lambda p: (p / 'x.json').write_text('{"a": 1}') and str(p / 'x.json'),
     'not a Hugging Face tokenizer.json'),
    (lambda p: (p / 'e').mkdir() or str(p / 'e'),
     'the folder holds no tokenizer.json and no tokenizer.model'),
    (lambda p: hf_fixtures.bpe_tokenizer_json(p / 'n' / 'tokenizer.json',
                                              DOCS, special_tokens=('<x>',)),
     'the tokenizer names no end-of-document token'),
])
def test_a_path_that_is_no_tokenizer_is_one_sentence(tmp_path, make,
                                                     message):
  path = make(tmp_path)
  with pytest.raises(UsageError, match=r'^config.data.tokenizer_path=.*: '
                     + message):
    data.datasets.given_tokenizer({'name': 'shakespeare',
                                   'tokenizer_path': path})


def test_conflicting_tokenizer_fields_are_refused_before_preparing(
    corpus, spm_path, tmp_path):
  cfg = recipes.base_config()
  cfg.data.update(cfg_for(corpus, tmp_path, tokenizer_path=spm_path))
  run_plan.checked(Experiment.of(cfg))  # fine as it is
  size = spm.SentencePieceProcessor(model_file=spm_path).get_piece_size()
  for fields, message in (
      ({'tokenizer': 'byte'}, r"config.data.tokenizer='byte' trains a "
       r'tokenizer on the corpus but config.data.tokenizer_path=.* gives a '
       r'sentencepiece one; unset it \(--config.data.tokenizer=\)\.$'),
      ({'vocab_size': 32000}, rf'config.data.vocab_size=32000 but the '
       rf'tokenizer of .* has {size} ids; unset it'),
      ({'tokenizer_path': str(tmp_path / 'missing')},
       'no such file or folder')):
    bad = ml_collections.ConfigDict(cfg.to_dict())
    bad.data.update(fields)
    with pytest.raises(UsageError, match=message):
      run_plan.checked(Experiment.of(bad))
  assert not os.path.exists(tmp_path / 'tfds')  # nothing prepared
  # The same kind and size, or unset on the command line ('' and 0): fine.
  for fields in ({'tokenizer': 'sentencepiece', 'vocab_size': size},
                 {'tokenizer': '', 'vocab_size': 0}):
    ok = ml_collections.ConfigDict(cfg.to_dict())
    ok.data.update(fields)
    run_plan.checked(Experiment.of(ok))
