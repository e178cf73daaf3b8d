"""The model families' registry, and the rule that keeps it the one place
that knows which model is which."""

import pathlib
import re

import pytest
import repo
from flax import nnx

from jax_transformer.errors import UsageError
from jax_transformer.interop import torch_layouts
from jax_transformer.model import families
from jax_transformer.model.config import gpt2_small, transformer_base
from jax_transformer.model.models import DecoderLM, EncoderDecoder

TINY = dict(vocab_size=16, d_model=8, num_heads=2, d_ff=16, max_len=8)


def test_the_registry_holds_both_kinds_with_their_classes():
  assert set(families.FAMILIES) == {'decoder_lm', 'encoder_decoder'}
  lm, ed = families.family('decoder_lm'), families.family('encoder_decoder')
  assert (lm.model_class, lm.has_source) == (DecoderLM, False)
  assert (ed.model_class, ed.has_source) == (EncoderDecoder, True)
  assert families.family_of(
      DecoderLM(gpt2_small(num_decoder_layers=1, **TINY), nnx.Rngs(0))) is lm
  assert families.family_of(EncoderDecoder(transformer_base(
      num_encoder_layers=1, num_decoder_layers=1, **TINY),
      nnx.Rngs(0))) is ed


def test_each_family_names_a_torch_layout_that_exists():
  for record in families.FAMILIES.values():
    layout = torch_layouts.of_kind(record.kind)
    assert layout.name == record.torch_layout
    assert torch_layouts.kind_of(layout.name) == record.kind


def test_decoding_inputs_follow_the_source_side():
  lm, ed = families.DECODER_LM, families.ENCODER_DECODER
  assert lm.prompt_inputs('ids', 'mask') == {'prompt_ids': 'ids',
                                             'prompt_mask': 'mask'}
  assert ed.prompt_inputs('ids') == {'src_ids': 'ids', 'src_mask': None}
  assert (lm.decoder_prefix(7), ed.decoder_prefix(7)) == (7, 1)


def test_an_unknown_kind_is_refused_in_one_sentence():
  with pytest.raises(UsageError) as e:
    families.family('bert')
  assert str(e.value) == ("model_kind must be one of ['decoder_lm', "
                          "'encoder_decoder'], got 'bert'.")
  with pytest.raises(TypeError) as e:
    families.family_of(object())
  assert str(e.value) == ('model must be a jax_transformer EncoderDecoder '
                          'or DecoderLM, got object.')


def test_register_adds_a_family_and_refuses_a_taken_kind(monkeypatch):
  monkeypatch.setattr(families, 'FAMILIES', dict(families.FAMILIES))
  prefix_lm = families.register(families.Family(
      kind='prefix_lm', class_path='jax_transformer.model.models:DecoderLM',
      has_source=False, loss_call=families.DECODER_LM.loss_call,
      empty_cache=families.DECODER_LM.empty_cache, torch_layout='gpt2'))
  assert families.family('prefix_lm') is prefix_lm
  with pytest.raises(ValueError, match="'decoder_lm' is already registered"):
    families.register(families.DECODER_LM)


class Scorer(DecoderLM):
  """A family of its own on DecoderLM's code, that neither decodes nor
  exports to PyTorch."""


def test_a_family_without_decoding_or_layout_is_refused_there(monkeypatch):
  from jax_transformer import decoding
  monkeypatch.setattr(families, 'FAMILIES', dict(families.FAMILIES))
  scorer = families.register(families.Family(
      kind='scorer', class_path=f'{__name__}:Scorer', has_source=False,
      loss_call=families.DECODER_LM.loss_call))
  model = Scorer(gpt2_small(num_decoder_layers=1, **TINY), nnx.Rngs(0))
  assert families.family_of(model) is scorer  # its own class, not its base's
  with pytest.raises(UsageError, match='^A Scorer does not generate text.$'):
    decoding.generate(model, [[1]], max_new_tokens=1)
  with pytest.raises(UsageError, match='^A scorer model has no PyTorch '):
    torch_layouts.of_kind('scorer')


# Tests of a model's family by its class or its kind's name; outside
# model/ every room asks the record (family, family_of) instead.
CHOICE_BY_KIND = re.compile(
    r"isinstance\([^)]*\bEncoderDecoder\b"
    r"|[!=]=\s*['\"]encoder_decoder['\"]"
    r"|['\"]encoder_decoder['\"]\s*[!=]="
    r"|['\"]src['\"]\s+in\s+batch\b")


def choices_by_kind() -> list[str]:
  root = pathlib.Path(repo.ROOT)
  files = [p for p in (root / 'jax_transformer').rglob('*.py')
           if 'model' not in p.relative_to(root / 'jax_transformer').parts]
  files += [*(root / 'scripts').rglob('*.py'), root / 'train.py']
  return [f'{p.relative_to(root)}:{n}: {line.strip()}'
          for p in files
          for n, line in enumerate(p.read_text().splitlines(), 1)
          if CHOICE_BY_KIND.search(line)]


def test_no_room_outside_the_model_chooses_by_class_or_kind_name():
  assert not choices_by_kind(), choices_by_kind()


@pytest.mark.parametrize('line, found', [
    ('  if isinstance(model, EncoderDecoder):', True),
    ("  translation = cfg.model_kind == 'encoder_decoder'", True),
    ("  if 'encoder_decoder' != kind:", True),
    ("  if 'src' in batch:", True),
    ('  if family_of(model).has_source:', False),
    ("  c.model_kind = 'encoder_decoder'", False),
])
def test_the_rule_sees_a_choice_by_kind(line, found):
  assert bool(CHOICE_BY_KIND.search(line)) == found
