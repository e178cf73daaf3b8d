"""Tokenizers: reserved ids, round trips, save/load of both kinds."""

import pickle

import pytest

from jax_transformer.data import testing as data_testing
from jax_transformer.data import tokenizers as tok

TEXTS = ['Who is there?', 'Nay, answer me: stand, and unfold yourself.',
         'Ünïcödé, ☃ and 12345 digits.', '']


@pytest.fixture(scope='module')
def spm_tokenizer():
  corpus = [f'{en}\n{de}' for en, de in data_testing.fake_sentence_pairs(300)]
  corpus += TEXTS * 3
  return tok.SentencePieceTokenizer.train(corpus, vocab_size=400)


def test_reserved_ids_are_fixed():
  assert (tok.PAD_ID, tok.BOS_ID, tok.EOS_ID, tok.UNK_ID) == (0, 1, 2, 3)


@pytest.mark.parametrize('text', TEXTS)
def test_byte_round_trip(text):
  t = tok.ByteTokenizer()
  ids = t.encode(text)
  assert len(ids) == len(text.encode('utf-8'))
  assert all(tok.NUM_RESERVED <= i < t.vocab_size for i in ids)
  assert t.decode(ids) == text


def test_byte_decode_drops_special_ids():
  t = tok.ByteTokenizer()
  ids = [tok.BOS_ID] + t.encode('ab') + [tok.EOS_ID, tok.PAD_ID, tok.PAD_ID]
  assert t.decode(ids) == 'ab'
  assert t.vocab_size == 260


@pytest.mark.parametrize('text', TEXTS)
def test_spm_round_trip(spm_tokenizer, text):
  ids = spm_tokenizer.encode(text)
  # encode never emits pad/bos/eos; byte fallback means no UNK either.
  assert not set(ids) & {tok.PAD_ID, tok.BOS_ID, tok.EOS_ID, tok.UNK_ID}
  assert spm_tokenizer.decode(ids) == text


def test_spm_special_pieces_and_decode(spm_tokenizer):
  pieces = [spm_tokenizer.id_to_piece(i) for i in range(4)]
  assert pieces == ['<pad>', '<s>', '</s>', '<unk>']
  ids = spm_tokenizer.encode('The dog number 7 runs well.')
  padded = [tok.BOS_ID] + ids + [tok.EOS_ID] + [tok.PAD_ID] * 5
  assert spm_tokenizer.decode(padded) == 'The dog number 7 runs well.'


def test_spm_training_is_deterministic(spm_tokenizer):
  corpus = [f'{en}\n{de}' for en, de in data_testing.fake_sentence_pairs(300)]
  corpus += TEXTS * 3
  again = tok.SentencePieceTokenizer.train(corpus, vocab_size=400)
  assert again.model_proto == spm_tokenizer.model_proto


def test_spm_bpe_trains():
  corpus = [en for en, _ in data_testing.fake_sentence_pairs(200)]
  t = tok.SentencePieceTokenizer.train(corpus, vocab_size=350,
                                       model_type='bpe')
  assert t.decode(t.encode(corpus[5])) == corpus[5]
  # Frequent training words become single pieces (unigram needs a more
  # varied corpus than this one to do the same).
  text = 'The dog number 12 sleeps very well.'
  assert len(t.encode(text)) < len(text.split()) + 4
  with pytest.raises(ValueError, match='model_type'):
    tok.SentencePieceTokenizer.train(corpus, 300, model_type='word')


@pytest.mark.parametrize('kind', ['byte', 'sentencepiece', 'huggingface'])
def test_save_and_load(tmp_path, spm_tokenizer, kind):
  original = {'byte': tok.ByteTokenizer(), 'sentencepiece': spm_tokenizer,
              'huggingface': gpt2_style_tokenizer()}[kind]
  original.save(tmp_path / 'tok')
  restored = tok.load_tokenizer(tmp_path / 'tok')
  assert type(restored) is type(original)
  assert restored.vocab_size == original.vocab_size
  for text in TEXTS:
    assert restored.encode(text) == original.encode(text)
  # Pickling is how tokenizers reach worker processes.
  unpickled = pickle.loads(pickle.dumps(original))
  assert unpickled.encode(TEXTS[1]) == original.encode(TEXTS[1])


def test_load_rejects_missing_or_unknown(tmp_path):
  with pytest.raises(FileNotFoundError):
    tok.load_tokenizer(tmp_path)
  (tmp_path / 'tokenizer.json').write_text('{"kind": "words"}')
  with pytest.raises(ValueError, match='words'):
    tok.load_tokenizer(tmp_path)


def gpt2_style_tokenizer():
  """A tokenizer whose only special token, <|endoftext|>, comes last (as in
  GPT-2), so ids 0, 1, 2 are ordinary tokens."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  vocab = {w: i for i, w in enumerate(['!', 'a', 'b', 'c', 'hello', 'world'])}
  backend = Tokenizer(models.WordLevel(vocab, unk_token='!'))
  backend.pre_tokenizer = pre_tokenizers.Whitespace()
  backend.add_special_tokens(['<|endoftext|>'])
  return tok.HuggingFaceTokenizer(backend.to_str(), {
      'bos': '<|endoftext|>', 'eos': '<|endoftext|>', 'unk': '<|endoftext|>'})


def test_huggingface_tokenizer_exposes_its_own_special_ids():
  t = gpt2_style_tokenizer()
  assert (t.pad_id, t.bos_id, t.eos_id, t.vocab_size) == (None, 6, 6, 7)
  assert t.encode('a b hello') == [1, 2, 4]
  # Its special token is dropped; ids 0-2 are text here, not PAD/BOS/EOS.
  assert t.decode([6, 0, 1, 2, 6]) == '! a b'
  with pytest.raises(ValueError, match="The pad token '<pad>' is not in"):
    tok.HuggingFaceTokenizer(t.tokenizer_json, {'pad': '<pad>'})
