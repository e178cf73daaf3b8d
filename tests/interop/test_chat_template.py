"""The checkpoint's own chat conventions, both ways (data/chat.py,
interop/hf_tokenizer.py): a tokenizer's chat_template renders chat
records, every assistant turn trains, and the export's tokenizer,
chat_template.jinja and generation_config.json make transformers'
apply_chat_template and generate give the project's tokens.

Tiny random Llama 3 and Qwen2 models made by transformers (hf_models),
with a byte-level BPE trained offline that knows two turn markers, and a
template in the style of ChatML; the Qwen2 one names no BOS, as Qwen2's
tokenizers do."""

import importlib.util
import json
import os

import numpy as np
import pytest
import repo
import torch
import transformers
from hf_models import _SHAPE, FAMILIES, SPECIALS, VOCAB, randomize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jax_transformer import decoding
from jax_transformer.data import batching, chat, files
from jax_transformer.data import testing as data_testing
from jax_transformer.data.tokenizers import ByteTokenizer, HuggingFaceTokenizer
from jax_transformer.errors import UsageError
from jax_transformer.interop import hf_checkpoint, hf_tokenizer
from jax_transformer.train import init_from
from jax_transformer.workdirs import importer, restore

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Llama 3 style: the template writes the BOS itself.
TEMPLATE_WITH_BOS = '{{ bos_token }}' + TEMPLATE
TURNS = ['<|im_start|>', '<|im_end|>']

CHAT = [{'role': 'system', 'content': 'Be brief.'},
        {'role': 'user', 'content': 'Who is Macbeth?'},
        {'role': 'assistant', 'content': 'A thane of Scotland.'},
        {'role': 'tool', 'content': '{"result": "Glamis"}'},
        {'role': 'user', 'content': 'And his wife?'},
        {'role': 'assistant', 'content': 'Lady Macbeth, my lord.'}]


def load_script(name):
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(repo.ROOT, 'scripts', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def hf_tokenizer_with_turns(template: str, bos: bool):
  backend = Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  backend.train_from_iterator(
      [data_testing.fake_play(p) for p in ('macbeth', 'lear')],
      trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS + TURNS,
                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, pad_token='<pad>', eos_token='</s>',
      unk_token='<unk>', **({'bos_token': '<s>'} if bos else {}))
  tok.chat_template = template
  return tok


@pytest.fixture(scope='module', params=['llama3', 'qwen2'])
def chat_dir(request, tmp_path_factory):
  """(folder, torch model): Llama 3 with a template that writes its BOS,
  Qwen2 without a BOS and a template that writes none."""
  family = request.param
  folder = str(tmp_path_factory.mktemp('chat') / family)
  torch.manual_seed(7)
  if family == 'qwen2':  # Qwen2's config.json names no BOS either
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **{**_SHAPE, 'bos_token_id': None}, tie_word_embeddings=True))
  else:
    model = FAMILIES[family]()
  model = randomize(model, 7).eval()
  model.save_pretrained(folder)
  llama = family == 'llama3'
  hf_tokenizer_with_turns(TEMPLATE_WITH_BOS if llama else TEMPLATE,
                          bos=llama).save_pretrained(folder)
  return folder, model


def exported_tokenizer(tok, tmp_path):
  out = str(tmp_path / 'exported_tokenizer')
  hf_tokenizer.save_pretrained(tok, out)
  return transformers.AutoTokenizer.from_pretrained(out), out


def row_of(tok, messages, last_only=False):
  prompt, completion = chat.stored_ids(tok, chat.stored_text(messages, 'x'))
  return batching.instruction_example(prompt, completion,
                                      *batching.markers(tok),
                                      last_only=last_only)


def test_the_tokenizers_template_renders_every_assistant_turn(
    chat_dir, tmp_path):
  folder, _ = chat_dir
  tok = HuggingFaceTokenizer.from_pretrained(folder)
  assert tok.chat_template in (TEMPLATE, TEMPLATE_WITH_BOS)
  ex = row_of(tok, CHAT)
  bos, eos = batching.markers(tok)
  assert ex['inputs'][0] == bos and ex['targets'][-1] == eos
  # Both assistant turns train, with their end-of-turn marker; the system,
  # user and tool messages are context. The row's EOS trains too.
  trained = ex['targets'][ex['loss_mask'] > 0]
  assert tok.decode(trained[:-1]) == (
      'A thane of Scotland.\nLady Macbeth, my lord.\n')
  im_end = tok.encode('<|im_end|>')[0]
  assert list(trained).count(im_end) == 2
  context = tok.decode(ex['targets'][ex['loss_mask'] == 0])
  assert 'Who is Macbeth?' in context and 'Glamis' in context
  assert 'tool\n' in context
  # last_only: the last reply alone.
  last = ex['targets'][row_of(tok, CHAT, last_only=True)['loss_mask'] > 0]
  assert tok.decode(last[:-1]) == 'Lady Macbeth, my lord.\n'
  # weight 0 on a reply: context.
  quiet = [dict(m, weight=0) if i == 2 else m for i, m in enumerate(CHAT)]
  assert list(row_of(tok, quiet)['loss_mask']) == list(
      row_of(tok, CHAT, last_only=True)['loss_mask'])

  # The export renders the same tokens with transformers.
  hf, out = exported_tokenizer(tok, tmp_path)
  full = hf.apply_chat_template(CHAT, tokenize=True, return_dict=False)
  assert list(full) == list(ex['inputs'])
  for n in (2, 5):  # a prompt for inference, history included
    want = hf.apply_chat_template(CHAT[:n], tokenize=True,
                                  add_generation_prompt=True,
                                  return_dict=False)
    assert list(want) == chat.prompt_ids(tok, CHAT[:n])
  # The tokenizer adds the BOS that every row began with.
  assert hf('Who is Macbeth?').input_ids == [bos, *tok.encode(
      'Who is Macbeth?')]
  with open(os.path.join(out, 'generation_config.json')) as f:
    gen = json.load(f)
  assert gen['bos_token_id'] == bos
  assert gen['eos_token_id'] == [eos, im_end]
  # What the export holds reads back as the same tokenizer.
  again = HuggingFaceTokenizer.from_pretrained(out)
  assert again.bos_id == bos and again.chat_template.endswith(TEMPLATE)


def test_the_fixed_template_without_a_chat_template(tmp_path):
  tok = ByteTokenizer()
  ex = row_of(tok, CHAT)
  trained = ex['targets'][ex['loss_mask'] > 0]
  # Each reply ends with EOS; the row's last EOS is its own.
  assert list(trained).count(tok.eos_id) == 2
  assert tok.decode(ex['inputs']) == (
      '<|system|>\nBe brief.\n<|user|>\nWho is Macbeth?\n<|assistant|>\n'
      'A thane of Scotland.<|tool|>\n{"result": "Glamis"}\n<|user|>\nAnd '
      'his wife?\n<|assistant|>\nLady Macbeth, my lord.')
  # transformers renders the exported fixed template to the same ids.
  hf, _ = exported_tokenizer(hf_tokenizer.to_huggingface(tok), tmp_path)
  assert list(hf.apply_chat_template(
      CHAT, tokenize=True, return_dict=False)) == [*ex['inputs'],
                                                   tok.eos_id]
  assert list(hf.apply_chat_template(
      CHAT[:5], tokenize=True, add_generation_prompt=True,
      return_dict=False)) == chat.prompt_ids(tok, CHAT[:5])
  with pytest.raises(UsageError, match="role 'robot' is not one of the "
                     "fixed template's"):
    row_of(tok, [{'role': 'robot', 'content': 'hi'}, *CHAT[2:3]])


def test_bad_chats_are_one_sentence():
  for messages, match in (
      ([], 'non-empty list'),
      ([{'role': 'user', 'content': 'hi'}], "last message must be the "
       "assistant's"),
      ([{'role': 'user', 'content': 3}], 'a message must be'),
      ([{'role': 'assistant', 'content': 'a', 'weight': 0}],
       'nothing would train'),
      ([{'role': 'assistant', 'content': 'a', 'weight': 0.5}], 'weight')):
    with pytest.raises(UsageError, match=match) as e:
      files.render_chat(messages, 'f.jsonl, line 3')
    assert str(e.value).startswith('f.jsonl, line 3:')
    assert '\n' not in str(e.value)


@pytest.mark.slow
def test_transformers_generate_on_the_export_gives_the_projects_tokens(
    capsys, chat_dir, tmp_path, fake_data_dir):
  folder, _ = chat_dir
  work, out = str(tmp_path / 'w'), str(tmp_path / 'hf')
  importer = load_script('import_params')
  assert importer.main(['--from', folder, '--config',
                        'configs/finetune.py:llama_instruct', '--workdir',
                        work, f'--config.data.data_dir={fake_data_dir}',
                        '--config.data.train_files=' + folder,
                        '--config.model.dtype=float32',
                        '--config.seq_len=64']) == 0
  assert load_script('export').main(['--workdir', work, '--format', 'hf',
                                     '--out', out]) == 0
  capsys.readouterr()
  trained = restore.load_model(work)
  tok = trained.tokenizer
  assert tok.chat_template.endswith(TEMPLATE)  # imported with the model
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32).eval()
  stops = hf_model.generation_config.eos_token_id
  stops = stops if isinstance(stops, list) else [stops]
  short = [{'role': 'user', 'content': 'Who?'},
           {'role': 'assistant', 'content': 'A thane.'},
           {'role': 'user', 'content': 'And she?'}]
  for messages in (CHAT[:2], short):  # within the tiny models' 128
    ids = chat.prompt_ids(tok, messages)
    given = hf_tok.apply_chat_template(messages, add_generation_prompt=True,
                                       tokenize=True, return_dict=False)
    assert list(given) == ids
    ours = decoding.row_tokens(decoding.generate(
        trained.model, [ids], max_new_tokens=12, eos_id=None), 0)
    cut = next((i + 1 for i, t in enumerate(ours) if t in stops), len(ours))
    with torch.no_grad():
      theirs = hf_model.generate(torch.tensor([ids]), max_new_tokens=12,
                                 do_sample=False)[0, len(ids):].tolist()
    assert theirs[:cut] == ours[:cut]
    assert np.all(np.asarray(ours) < VOCAB)
  # generate.py --chat prints the same reply, stopped at the turn's end.
  assert load_script('generate').main([
      '--workdir', work, '--chat', json.dumps(short),
      '--max_new_tokens', '12']) == 0
  assert capsys.readouterr().out == tok.decode(ours[:cut]) + '\n'


def test_generate_refuses_a_bad_chat_in_one_sentence(capsys, tmp_path):
  generate = load_script('generate')
  for value, said in (('[]', 'non-empty JSON list'),
                      ('[{"role": "user"', 'is not JSON'),
                      ('[{"role": "user", "content": 3}]',
                       'a message must be'),
                      (str(tmp_path / 'missing.json'), 'neither a JSON list')):
    assert generate.main(['--workdir', str(tmp_path), '--chat', value]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count('\n') == 1, err


def test_the_template_survives_specials_taken_from_config_json(tmp_path):
  folder = str(tmp_path / 'm')
  tok = hf_tokenizer_with_turns(TEMPLATE, bos=False)
  tok.save_pretrained(folder)
  # config.json names a BOS the tokenizer files do not: filled in, and the
  # template kept.
  got = hf_checkpoint.hf_tokenizer(folder, {'bos_token_id': 1})
  assert got.bos_id == 1 and got.chat_template == TEMPLATE


def test_a_hugging_face_folder_without_config_json_is_named_as_one(
    tmp_path):
  folder = tmp_path / 'llama_hf'
  folder.mkdir()
  hf_tokenizer_with_turns(TEMPLATE, bos=True).save_pretrained(str(folder))
  (folder / 'model.safetensors').write_bytes(b'')
  with pytest.raises(UsageError) as e:
    init_from.open_source(str(folder))
  said = str(e.value)
  assert 'holds a Hugging Face model (model.safetensors, tokenizer.json' in said
  assert 'it has no config.json' in said and 'training workdir' not in said
  (folder / 'config.json').write_text('{}')
  with pytest.raises(UsageError, match='its config.json names no model_type'):
    init_from.open_source(str(folder))


def test_the_import_note_says_which_ids_frame_the_rows():
  tok = HuggingFaceTokenizer(
      hf_tokenizer_with_turns(TEMPLATE, bos=True).backend_tokenizer.to_str(),
      {'bos': '<pad>', 'eos': '<s>'})  # ids 0 and 1, as Llama 3's tested
  note, = importer.reserved_id_notes(tok)
  assert note == ("The tokenizer's own BOS (id 0) and EOS (id 1), not the "
                  "project's reserved 1 and 2, begin and end every training "
                  'row, and generate.py stops at that EOS.')
  assert importer.reserved_id_notes(ByteTokenizer()) == []
