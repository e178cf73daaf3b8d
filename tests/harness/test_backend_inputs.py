"""The backend over the project's own tokenizer: lm-eval's token layout
(BOS first unless the model saw a token stream), left truncation at the
model's length, and what cannot be scored refused in one sentence."""

import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.data.tokenizers import ByteTokenizer
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment, base_config
from jax_transformer.harness import JaxTransformerLM, tasks
from jax_transformer.workdirs import restore

MAX_LEN = 24


def backend(lm_mode='examples', kind='decoder_lm'):
  config = base_config()
  config.model_kind = kind
  config.data.lm_mode = lm_mode
  model = jt.DecoderLM(jt.gpt2_small(vocab_size=260, num_decoder_layers=1,
                                     d_model=16, num_heads=2, d_ff=32,
                                     max_len=MAX_LEN), rngs=nnx.Rngs(0))
  trained = restore.Trained(model, ByteTokenizer(), Experiment.of(config), 0)
  return JaxTransformerLM(trained, batch_size=4)


def test_own_tokenizer_adds_bos_as_training_did():
  """A model trained on examples saw BOS first."""
  lm = backend()
  ids = lm.tok_encode('ab')
  assert ids[0] == lm.prefix_token_id == 1 and len(ids) == 3
  assert lm.tok_encode('ab', add_special_tokens=False) == ids[1:]


def test_a_stream_model_gets_no_bos_and_eos_as_its_prefix():
  lm = backend(lm_mode='stream')
  assert lm.tok_encode('ab') == lm.tok_encode('ab', add_special_tokens=False)
  assert lm.prefix_token_id == lm.eot_token_id == 2


def test_inputs_are_cut_from_the_left_at_the_models_length():
  lm = backend()
  request = lm._request(list(range(3, 40)), [7, 8])
  assert len(request.inputs) == MAX_LEN
  assert request.inputs[-1] == 7 and request.targets == (7, 8)


def test_a_continuation_longer_than_the_model_is_one_sentence():
  with pytest.raises(UsageError, match='does not fit the model'):
    backend()._request([5], list(range(3, 3 + MAX_LEN + 1)))


def test_an_encoder_decoder_is_refused_saying_how_to_score_it():
  with pytest.raises(UsageError, match='BLEU and chrF'):
    backend(kind='encoder_decoder')


@pytest.mark.parametrize('value', [0, -3, 'many', 2.5])
def test_a_bad_batch_size_is_refused(value):
  with pytest.raises(UsageError, match='batch_size'):
    JaxTransformerLM(backend().trained, batch_size=value)


def test_a_generation_task_with_no_room_for_its_context_is_refused():
  """shakespeare_continue asks for 64 new tokens; the model holds 24."""
  loaded = tasks.load_tasks(tasks.Settings(('shakespeare_continue',)))
  with pytest.raises(UsageError, match='leaves no room'):
    tasks.check_fits(MAX_LEN, loaded[1], 256)
