"""A workdir's tokenizer for transformers: bytes as a byte-level BPE with
the same ids, saved as transformers reads it, and the reserved ids an
imported tokenizer puts elsewhere."""

import types

from jax_transformer.data import tokenizers as tok
from jax_transformer.interop import hf_tokenizer

TEXTS = ['Who is there?', 'Ünïcödé, ☃ and 12345 digits.', '',
         '  two  spaces\n\ttab']


def test_bytes_as_huggingface_tokenizer_keep_ids_and_text():
  byte = tok.ByteTokenizer()
  hf = hf_tokenizer.to_huggingface(byte)
  assert (hf.pad_id, hf.bos_id, hf.eos_id, hf.unk_id) == (0, 1, 2, 3)
  assert hf.vocab_size == 260
  assert hf_tokenizer.reserved_id_mismatches(hf) == []
  for text in TEXTS:
    assert hf.encode(text) == byte.encode(text)
    assert hf.decode(hf.encode(text)) == text
  ids = [tok.BOS_ID] + byte.encode('ab') + [tok.EOS_ID, tok.PAD_ID, 999]
  assert hf.decode(ids) == byte.decode(ids) == 'ab'
  assert hf_tokenizer.to_huggingface(hf) is hf


def test_sentencepiece_has_no_huggingface_form_here():
  assert hf_tokenizer.to_huggingface(
      types.SimpleNamespace(kind='sentencepiece')) is None


def test_save_pretrained_round_trips_through_from_pretrained(tmp_path):
  hf = hf_tokenizer.to_huggingface(tok.ByteTokenizer())
  only_eos = tok.HuggingFaceTokenizer(hf.tokenizer_json, {'eos': '</s>'})
  for i, t in enumerate([hf, only_eos]):
    hf_tokenizer.save_pretrained(t, tmp_path / str(i))
    again = tok.HuggingFaceTokenizer.from_pretrained(tmp_path / str(i))
    # One without a BOS is written with the BOS its rows began with (EOS).
    assert again.special_tokens == {**t.special_tokens, 'bos': (
        t.special_tokens['bos'] or t.special_tokens['eos'])}
    assert again.encode(TEXTS[1]) == t.encode(TEXTS[1])


def test_reserved_id_mismatches_name_each_id_elsewhere():
  gpt2_like = types.SimpleNamespace(pad_id=None, bos_id=50256, eos_id=50256)
  assert hf_tokenizer.reserved_id_mismatches(gpt2_like) == [
      'pad is None', 'bos is 50256', 'eos is 50256']
  assert hf_tokenizer.reserved_id_mismatches(tok.ByteTokenizer()) == []
