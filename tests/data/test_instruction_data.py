"""Instruction data (data/files.py, data.direction='prompt-completion'):
prompt/completion or chat records, rows of a decoder LM whose loss_mask
keeps the completion's targets alone; and rows framed with the tokenizer's
own BOS/EOS (batching.markers)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from jax_transformer import data
from jax_transformer.data import batching, chat, files, splits
from jax_transformer.errors import UsageError
from jax_transformer.model import families

RECORDS = [{'prompt': f'Q{i}: what is {i} + {i}?\nA:',
            'completion': f' {2 * i}.'} for i in range(12)]
CHATS = [{'messages': [{'role': 'system', 'content': 'Be brief.'},
                       {'role': 'user', 'content': f'Say {i}.'},
                       {'role': 'assistant', 'content': f'{i}!'}]}
         for i in range(12)]


def write_jsonl(path, records):
  path.write_text(''.join(json.dumps(r) + '\n' for r in records))


def cfg_for(tmp_path, path):
  return {'name': 'files', 'data_dir': str(tmp_path / 'tfds'),
          'train_files': str(path), 'direction': 'prompt-completion',
          'lm_mode': 'examples'}


def first_batch(cfg, prepared, split="train", seq_len=64):
  it = data.make_iterator(cfg, split, prepared.tokenizer, batch_size=4,
                          seq_len=seq_len, seed=0, shuffle=False,
                          process_index=0, process_count=1)
  try:
    return next(it)
  finally:
    it.close()


def test_instruction_example_masks_the_prompt():
  ex = batching.instruction_example([10, 11, 12], [20, 21], bos=7, eos=8)
  np.testing.assert_array_equal(ex['inputs'], [7, 10, 11, 12, 20, 21])
  np.testing.assert_array_equal(ex['targets'], [10, 11, 12, 20, 21, 8])
  # Trains on the completion and its EOS only.
  np.testing.assert_array_equal(ex['loss_mask'], [0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize('records', [RECORDS, CHATS], ids=['pairs', 'chat'])
def test_completions_alone_carry_loss_weight(tmp_path, records):
  path = tmp_path / 'sft.jsonl'
  write_jsonl(path, records)
  cfg = cfg_for(tmp_path, path)
  prepared = data.prepare_for(cfg)
  assert splits.is_instruction(prepared.spec)
  tok = prepared.tokenizer
  for split in ('train', 'validation'):
    b = first_batch(cfg, prepared, split)
    assert set(b) == {'inputs', 'targets', 'loss_mask', 'segment_ids',
                      'positions'}
    for row in range(len(b['inputs'])):
      real = b['segment_ids'][row] > 0
      if not real.any():
        continue
      kept = b['targets'][row][real & (b['loss_mask'][row] > 0)]
      assert kept[-1] == tok.eos_id
      completion = tok.decode(list(kept[:-1]))
      prompt = tok.decode(list(b['targets'][row][real & (
          b['loss_mask'][row] == 0)]))
      expected = [(fixed_template(r['messages']) if 'messages' in r
                   else r) for r in records]
      assert {'prompt': prompt, 'completion': completion} in expected
  # steps.forward's weights are the mask on real tokens.
  weights = forward_weights(b)
  np.testing.assert_array_equal(
      weights, (b['segment_ids'] > 0) & (b['loss_mask'] > 0))


def fixed_template(messages):
  """{'prompt', 'completion'} text of a one-reply chat in the fixed
  template (data/chat.py)."""
  prompt = ''.join(f'<|{m["role"]}|>\n{m["content"]}\n'
                   for m in messages[:-1])
  return {'prompt': prompt + '<|assistant|>\n',
          'completion': messages[-1]['content']}


def forward_weights(b):
  """The loss weights the decoder LM's family takes from batch b (what
  steps.forward hands the loss)."""
  batch = {k: jnp.asarray(v) for k, v in b.items()}
  call = families.DECODER_LM.loss_call(batch,
                                       lambda s: {'segment_ids': s})
  return np.asarray(call.weights)


def test_chats_are_kept_as_messages_and_rendered_when_tokenized():
  # More in tests/interop/test_chat_template.py.
  stored = files.render_chat(CHATS[3]['messages'], 'x')
  assert stored['completion'] == ''
  assert chat.messages_of(stored['prompt']) == CHATS[3]['messages']
  prompt, completion = chat.stored_ids(data.ByteTokenizer(),
                                       stored['prompt'])
  byte = data.ByteTokenizer()
  assert byte.decode(prompt) == (
      '<|system|>\nBe brief.\n<|user|>\nSay 3.\n<|assistant|>\n')
  assert byte.decode(completion) == '3!'
  with pytest.raises(UsageError, match="last message must be the "
                     "assistant's") as e:
    files.render_chat([{'role': 'user', 'content': 'hi'}], 'f.jsonl, line 3')
  assert str(e.value).startswith('f.jsonl, line 3:')


def test_rows_are_framed_with_the_tokenizers_own_markers():
  byte = data.ByteTokenizer()
  assert batching.markers(byte) == (data.BOS_ID, data.EOS_ID) == (1, 2)

  class GPT2Like:  # <|endoftext|> only: both ends
    bos_id, eos_id = 50256, 50256

  class EosOnly:
    bos_id, eos_id = None, 7

  assert batching.markers(GPT2Like()) == (50256, 50256)
  assert batching.markers(EosOnly()) == (7, 7)
  # The project's tokenizers frame rows as before (reserved ids).
  ex = batching.lm_example([5, 6], *batching.markers(byte))
  np.testing.assert_array_equal(ex['inputs'], [1, 5, 6])
  np.testing.assert_array_equal(ex['targets'], [5, 6, 2])
  ex = batching.lm_example([5, 6], *batching.markers(GPT2Like()))
  np.testing.assert_array_equal(ex['inputs'], [50256, 5, 6])
  np.testing.assert_array_equal(ex['targets'], [5, 6, 50256])


def test_chat_train_last_trains_the_final_reply_alone(tmp_path):
  """config.data.chat_train: 'all' (default) trains both replies of a
  two-reply chat, 'last' the second alone; the inputs are the same."""
  two = [{'messages': [{'role': 'user', 'content': f'Say {i}.'},
                       {'role': 'assistant', 'content': f'{i}!'},
                       {'role': 'user', 'content': 'Again.'},
                       {'role': 'assistant', 'content': f'{i}{i}!'}]}
         for i in range(12)]
  path = tmp_path / 'chat.jsonl'
  write_jsonl(path, two)
  cfg = cfg_for(tmp_path, path)
  prepared = data.prepare_for(cfg)
  every = first_batch(cfg, prepared, seq_len=128)
  last = first_batch(dict(cfg, chat_train='last'), prepared, seq_len=128)
  np.testing.assert_array_equal(every['inputs'], last['inputs'])
  tok = prepared.tokenizer
  for row in range(len(every['inputs'])):
    def trained(b):
      return tok.decode([t for t, m in zip(b['targets'][row],
                                           b['loss_mask'][row])
                         if m and t != tok.eos_id])
    prompt = tok.decode(list(every['inputs'][row]))
    both, final = trained(every), trained(last)
    assert final and final in both and len(final) < len(both), (prompt,)
  with pytest.raises(UsageError, match="chat_train must be 'all' or 'last'"):
    data.DataConfig.of(dict(cfg, chat_train='first')).check()
