"""scripts/export.py and scripts/import_params.py, run in-process.

Workdirs are written by the import path from random PyTorch weights (no
training): a reference encoder-decoder state_dict, and a Hugging Face GPT-2
directory with a BPE tokenizer trained by the `tokenizers` library.
"""

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
import repo
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch_helpers import randomize

from jax_transformer import data
from jax_transformer.data import testing as data_testing
from jax_transformer.errors import UsageError
from jax_transformer.experiment import DataConfig, Experiment, TrainBatches
from jax_transformer.interop.torch_reference import TorchTransformer
from jax_transformer.model import params as params_lib
from jax_transformer.model.models import DecoderLM
from jax_transformer.train import checkpoint, trainer
from jax_transformer.workdirs import exporter as export_lib
from jax_transformer.workdirs import importer, restore

ENDE = os.path.join(repo.ROOT, 'configs/translate_ende.py:tiny')
GPT2 = os.path.join(repo.ROOT, 'configs/gpt2_small.py:shakespeare')
GPT2_SHAPE = ['--config.model.d_model=32', '--config.model.num_heads=4',
              '--config.model.num_decoder_layers=2', '--config.model.d_ff=128',
              '--config.model.max_len=64', '--config.model.dtype=float32',
              '--config.seq_len=32', '--config.batch_size=8',
              '--config.eval_batch_size=8']
SPECIALS = ['<pad>', '<s>', '</s>', '<unk>']  # ids 0-3, the reserved ids
PROMPT = 'The night of the storm'


def load_script(name):
  spec = importlib.util.spec_from_file_location(
      f'{name}_script', os.path.join(repo.ROOT, 'scripts', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


EXPORT, IMPORT, GENERATE = map(load_script,
                               ('export', 'import_params', 'generate'))


def run(capsys, script, *argv):
  """(exit code, stdout, stderr) of script.main(argv)."""
  capsys.readouterr()
  code = script.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


def export(capsys, workdir, fmt, out, *flags):
  """scripts/export.py's stdout; it must succeed."""
  code, stdout, err = run(capsys, EXPORT, '--workdir', workdir, '--format',
                          fmt, '--out', out, *flags)
  assert code == 0, err
  return stdout


def assert_bad_input(result, *needles):
  code, _, err = result
  assert code == 2, err
  assert len(err.strip().splitlines()) == 1, err
  for needle in needles:
    assert needle in err


@pytest.fixture(scope='module')
def data_dir(fake_data_dir):
  """The fake Shakespeare plays (Macbeth), prepared (validation data for
  --verify, training data for fine-tuning); shared through conftest.py."""
  return fake_data_dir


@pytest.fixture(scope='module')
def ende_file(tmp_path_factory):
  """A reference encoder-decoder state_dict of translate_ende:tiny's shape
  (vocabulary 260, a byte tokenizer beside it), saved as a PyTorch user
  would: torch.save(model.state_dict()), no JSON."""
  root = tmp_path_factory.mktemp('ende')
  cfg = IMPORT.load_config(ENDE, [])
  config = Experiment.of(cfg).model_config(260).replace(vocab_size=260)
  ref = randomize(TorchTransformer.from_config(config), seed=1)
  path = str(root / 'ende.pt')
  torch.save(ref.state_dict(), path)
  data.ByteTokenizer().save(str(root / 'ende.tokenizer'))
  return path


@pytest.fixture(scope='module')
def ende_workdir(tmp_path_factory, ende_file):
  workdir = str(tmp_path_factory.mktemp('work') / 'ende')
  done = importer.import_into(ende_file, IMPORT.load_config(ENDE, []),
                                   workdir)
  assert done.extra_flags == ['--config.model.vocab_size=260']
  return workdir


@pytest.fixture(scope='module')
def gpt2_dir(tmp_path_factory):
  """A Hugging Face GPT-2 directory: random tiny GPT2LMHeadModel and a
  byte-level BPE tokenizer, both saved with save_pretrained."""
  path = str(tmp_path_factory.mktemp('hf') / 'gpt2')
  backend = Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  backend.train_from_iterator(
      [data_testing.fake_play(p) for p in ('macbeth', 'lear')],
      trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  assert backend.get_vocab_size() == 300
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, pad_token='<pad>', bos_token='<s>',
      eos_token='</s>', unk_token='<unk>').save_pretrained(path)
  torch.manual_seed(0)
  config = transformers.GPT2Config(
      vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4,
      pad_token_id=0, bos_token_id=1, eos_token_id=2)
  randomize(transformers.GPT2LMHeadModel(config), seed=2).save_pretrained(path)
  return path


@pytest.fixture(scope='module')
def gpt2_flags(data_dir):
  return [*GPT2_SHAPE, f'--config.data.data_dir={data_dir}']


@pytest.fixture(scope='module')
def gpt2_workdir(tmp_path_factory, gpt2_dir, gpt2_flags):
  workdir = str(tmp_path_factory.mktemp('work') / 'gpt2')
  code = IMPORT.main(['--from', gpt2_dir, '--config', GPT2, '--workdir',
                      workdir, *gpt2_flags])
  assert code == 0
  return workdir


def hf_model(path):
  return transformers.GPT2LMHeadModel.from_pretrained(
      path, dtype=torch.float32).eval()


# ----------------------------------------------------------------------------
# Encoder-decoder: the reference nn.Transformer layout.


def test_encoder_decoder_export_loads_in_pytorch_with_equal_logits(
    capsys, tmp_path, ende_file, ende_workdir):
  out = str(tmp_path / 'ende.pt')
  stdout = export(capsys, ende_workdir, 'torch', out, '--verify')
  assert 'Largest absolute logit difference' in stdout
  # Import then export gives back the very tensors imported.
  exported, original = torch.load(out), torch.load(ende_file)
  assert exported.keys() == original.keys()
  for key, value in original.items():
    assert torch.equal(exported[key], value), key
  # The docstring's recipe: rebuild from the JSON, load strictly.
  with open(str(tmp_path / 'ende.json')) as f:
    meta = json.load(f)
  ref = TorchTransformer(**meta['torch_config'])
  ref.load_state_dict(torch.load(out, weights_only=True), strict=True)
  ref.eval()
  model, _ = restore.load_for_inference(ende_workdir)
  rng = np.random.RandomState(0)
  src, tgt = rng.randint(4, 260, (2, 9)), rng.randint(4, 260, (2, 7))
  src_mask, tgt_mask = np.ones_like(src, bool), np.ones_like(tgt, bool)
  src_mask[1, 6:], tgt_mask[1, 4:] = False, False
  with torch.no_grad():
    want = ref(torch.from_numpy(src), torch.from_numpy(tgt),
               src_key_padding_mask=torch.from_numpy(~src_mask),
               tgt_key_padding_mask=torch.from_numpy(~tgt_mask)).numpy()
  got = export_lib.logits_fn(model)({'src': src, 'src_mask': src_mask,
                                     'tgt': tgt, 'tgt_mask': tgt_mask})
  np.testing.assert_allclose(got[tgt_mask], want[tgt_mask], atol=1e-5)


def test_verify_fails_on_a_corrupted_export(capsys, tmp_path, ende_workdir,
                                            monkeypatch):
  write = export_lib.write

  def write_corrupted(trained, fmt, out):
    notes = write(trained, fmt, out)
    state_dict = torch.load(out)
    state_dict['transformer.decoder.norm.weight'][0] += 0.1
    torch.save(state_dict, out)
    return notes

  monkeypatch.setattr(export_lib, 'write', write_corrupted)
  code, _, err = run(capsys, EXPORT, '--workdir', ende_workdir, '--format',
                     'torch', '--out', tmp_path / 'bad.pt', '--verify')
  assert code == 1
  assert err.count('\n') == 1 and 'Verification failed' in err
  assert 'above the tolerance 0.0001' in err


def test_safetensors_round_trip_is_bit_identical(capsys, tmp_path,
                                                 ende_workdir):
  first = str(tmp_path / 'a.safetensors')
  second = str(tmp_path / 'b.safetensors')
  stdout = export(capsys, ende_workdir, 'safetensors', first, '--verify')
  assert 'difference on' in stdout and ': 0.' in stdout
  model, _ = restore.load_for_inference(ende_workdir)
  flat = load_file(first)
  assert flat.keys() == params_lib.split(model)[1].keys()
  assert 'encoder_layers.0.self_attn.query' in flat
  workdir = str(tmp_path / 'again')
  code, _, err = run(capsys, IMPORT, '--from', first, '--config', ENDE,
                     '--workdir', workdir, '--config.model.vocab_size=260')
  assert code == 0, err
  export(capsys, workdir, 'safetensors', second)
  again = load_file(second)
  for key, value in flat.items():
    np.testing.assert_array_equal(again[key], value, err_msg=key)
  assert export_lib.read_safetensors(second)[1] == export_lib.read_safetensors(
      first)[1]  # the metadata: format, kind, config, step


# ----------------------------------------------------------------------------
# GPT-2: a Hugging Face directory in, GPT2LMHeadModel out.


class RecordingTokenizer:
  """The workdir's tokenizer, noting the ids generate.py decodes."""

  def __init__(self, inner):
    self.inner, self.decoded = inner, []

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def decode(self, ids):
    self.decoded.append([int(i) for i in ids])
    return self.inner.decode(ids)


def test_hf_gpt2_imports_and_greedy_generate_matches_transformers(
    capsys, gpt2_dir, gpt2_workdir):
  tokenizer = data.load_tokenizer(os.path.join(gpt2_workdir, 'tokenizer'))
  assert tokenizer.kind == 'huggingface'
  assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2)
  ids = tokenizer.encode(PROMPT)
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2_dir)
  assert hf_tokenizer(PROMPT, add_special_tokens=False)['input_ids'] == ids
  saved = checkpoint.load_config(gpt2_workdir)
  assert saved.model.vocab_size == 300  # from the file, not the tokenizer

  recorder = {}

  def load(workdir):
    model, tok, stream, mesh = GENERATE._load(workdir)
    recorder['tok'] = RecordingTokenizer(tok)
    return model, recorder['tok'], stream, mesh

  capsys.readouterr()
  assert GENERATE.main(['--workdir', gpt2_workdir, '--input', PROMPT,
                        '--max_new_tokens', '24'], load=load) == 0
  printed = capsys.readouterr().out.rstrip('\n')
  (ours,) = recorder['tok'].decoded

  with torch.no_grad():
    out = hf_model(gpt2_dir).generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
        max_new_tokens=24, do_sample=False, eos_token_id=2, pad_token_id=0)
  theirs = out[0, len(ids):].tolist()
  if theirs and theirs[-1] == 2:
    theirs = theirs[:-1]
  assert len(theirs) > 3
  assert ours == theirs
  assert printed == PROMPT + tokenizer.decode(theirs)


def test_gpt2_exports_hf_and_torch_bit_identical_and_verified(
    capsys, tmp_path, gpt2_dir, gpt2_workdir):
  out = str(tmp_path / 'hf')
  stdout = export(capsys, gpt2_workdir, 'hf', out, '--verify')
  # Real batches: the workdir's validation split.
  assert 'of shakespeare validation data' in stdout
  assert 'random' not in stdout
  original = load_file(os.path.join(gpt2_dir, 'model.safetensors'))
  exported = load_file(os.path.join(out, 'model.safetensors'))
  assert exported.keys() == original.keys()
  for key, value in original.items():
    np.testing.assert_array_equal(exported[key], value, err_msg=key)
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  assert hf_tokenizer(PROMPT)['input_ids'] == transformers.AutoTokenizer\
      .from_pretrained(gpt2_dir)(PROMPT)['input_ids']
  assert hf_tokenizer.eos_token_id == 2

  pt = str(tmp_path / 'gpt2.pt')
  assert 'Largest' in export(capsys, gpt2_workdir, 'torch', pt, '--verify')
  with open(str(tmp_path / 'gpt2.json')) as f:
    meta = json.load(f)
  module = transformers.GPT2LMHeadModel(
      transformers.GPT2Config(**meta['torch_config']))
  module.load_state_dict(torch.load(pt, weights_only=True), strict=True)
  ids = torch.tensor([[5, 17, 90, 2, 299, 40]])
  with torch.no_grad():
    np.testing.assert_array_equal(module.eval()(ids).logits,
                                  hf_model(gpt2_dir)(ids).logits)
  model, _ = restore.load_for_inference(gpt2_workdir)
  got = export_lib.logits_fn(model)({'ids': ids.numpy(),
                                     'mask': np.ones(ids.shape, bool)})
  np.testing.assert_allclose(got, hf_model(gpt2_dir)(ids).logits.detach(),
                             atol=1e-5)


@pytest.mark.slow
def test_fine_tune_resumes_from_the_imported_step(capsys, tmp_path,
                                                  gpt2_workdir, gpt2_flags):
  workdir = str(tmp_path / 'tune')
  shutil.copytree(gpt2_workdir, workdir)
  cfg = IMPORT.load_config(GPT2, [
      *gpt2_flags, '--config.model.vocab_size=300', '--config.num_steps=2',
      '--config.log_every=1', '--config.eval_every=2', '--config.eval_steps=1',
      '--config.checkpoint_every=2', '--config.sample.enabled=False'])
  capsys.readouterr()
  trainer.train_and_evaluate(cfg, workdir)
  assert 'Resumed from step 0' in capsys.readouterr().out
  assert restore.open_workdir(workdir).steps == (0, 2)
  before, _ = restore.load_for_inference(workdir, 0)
  after, _ = restore.load_for_inference(workdir, 2)
  assert not np.array_equal(before.embed.embedding[...],
                            after.embed.embedding[...])


# ----------------------------------------------------------------------------
# Refusals: one sentence, exit code 2.


def test_export_refuses_bad_input(capsys, tmp_path, ende_workdir):
  out = tmp_path / 'x.pt'
  assert_bad_input(run(capsys, EXPORT, '--workdir', tmp_path / 'nothing',
                       '--format', 'torch', '--out', out),
                   'is not a directory')
  assert_bad_input(run(capsys, EXPORT, '--workdir', ende_workdir, '--format',
                       'torch', '--out', out, '--step', 7),
                   'has no checkpoint at step 7; it has steps [0]')
  assert_bad_input(run(capsys, EXPORT, '--workdir', ende_workdir, '--format',
                       'hf', '--out', tmp_path / 'hf'),
                   'decoder-only causal LM')
  assert not out.exists() and not (tmp_path / 'hf').exists()


def test_layouts_that_cannot_hold_the_model_name_every_field():
  cfg = IMPORT.load_config(os.path.join(repo.ROOT, 'configs/lm_shakespeare.py:tiny'),
                           ['--config.model.vocab_size=64'])
  model = nnx.eval_shape(lambda: DecoderLM(Experiment.of(cfg).model_config(64)))
  trained = restore.Trained(model, data.ByteTokenizer(), cfg, 0)
  # hf writes a rotary model as Llama, whose SwiGLU a GELU model lacks.
  for fmt, fields in (('hf', ("activation='gelu'",)),
                      ('torch', ("positional='rotary'", 'use_bias=False'))):
    with pytest.raises(UsageError) as err:
      export_lib.check_fits(trained, fmt)
    message = str(err.value)
    assert message.count('.') == 1 + message.count('.0')  # one sentence
    for field in fields:
      assert field in message


def test_import_refuses_bad_input(capsys, tmp_path, ende_file, ende_workdir):
  work = tmp_path / 'w'
  assert_bad_input(run(capsys, IMPORT, '--from', tmp_path / 'missing.pt',
                       '--config', ENDE, '--workdir', work),
                   '--from', 'does not exist')
  assert_bad_input(run(capsys, IMPORT, '--from', ende_file, '--config', ENDE,
                       '--workdir', ende_workdir), 'is not empty')
  assert_bad_input(run(capsys, IMPORT, '--from', ende_file, '--config', GPT2,
                       '--workdir', work),
                   "holds a encoder_decoder model but the config's "
                   "model_kind is 'decoder_lm'")
  # Shapes that do not fit name every key (a file without a config).
  code, _, err = run(capsys, IMPORT, '--from', ende_file, '--config', ENDE,
                     '--workdir', work, '--config.model.d_ff=48')
  assert code == 2
  for layer in ('encoder', 'decoder'):
    assert (f"key 'transformer.{layer}.layers.0.linear1.weight' has shape "
            '(64, 32) but the model expects (48, 32)') in err
  # A file that records its config names each field that differs.
  exported = str(tmp_path / 'ende.pt')
  export(capsys, ende_workdir, 'torch', exported)
  assert_bad_input(run(capsys, IMPORT, '--from', exported, '--config', ENDE,
                       '--workdir', work, '--config.model.activation=gelu',
                       '--config.model.layer_norm_eps=1e-6'),
                   "activation='relu'", "layer_norm_eps=1e-05",
                   '--config.model.activation=relu')
  assert not work.exists()


def test_initial_data_state_is_a_fresh_iterators(data_dir):
  batches = TrainBatches(
      DataConfig(name='shakespeare', data_dir=data_dir), batch_size=4,
      seq_len=16, seed=3)
  fresh = data.train_iterator(batches, data.ByteTokenizer())
  assert data.initial_state(batches) == fresh.get_state()
