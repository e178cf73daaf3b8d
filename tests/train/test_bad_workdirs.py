"""Bad input to decoding, evaluation, export and import: one sentence.

The scripts exit with status 2 and one line on stderr; the library raises
UsageError with the same sentence. The workdirs are built without training
(a fresh model saved as train.py saves it) and then broken on purpose:
emptied, stripped of checkpoints or tokenizer, config.json edited, the
checkpoint's files truncated.
"""

import functools
import gc
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import repo
import script_helpers

from jax_transformer import data, decoding
from jax_transformer.cli import load_config
from jax_transformer.data import testing as data_testing
from jax_transformer.decoding import inference
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.model.models import DecoderLM
from jax_transformer.runtime import workdir as workdir_lib
from jax_transformer.train import checkpoint, model_setup
from jax_transformer.workdirs import restore

# Reading a corrupt checkpoint, Orbax leaves its other reads unawaited; their
# errors (the same failure the tests check) surface later as unraisable.
# One xdist worker for the module, so that the collection below runs once.
pytestmark = [pytest.mark.filterwarnings(
    'ignore::pytest.PytestUnraisableExceptionWarning'),
    pytest.mark.xdist_group('bad_workdirs')]


@pytest.fixture(autouse=True, scope='module')
def collect_unawaited_reads():
  """Collects them here, under the filter above (in the teardown of the
  module's last test), not in a later module's test. Once per module: a
  full collection in a worker that has compiled for a while took about 3 s,
  which after each of the module's 57 tests was most of its time; any
  collected before, by the interpreter's own collections, surface in one
  of this module's tests, under the same filter."""
  yield
  gc.collect()
GENERATE, EVALUATE, EXPORT = map(script_helpers.load_script,
                                 ('generate', 'evaluate', 'export'))


@pytest.fixture(scope='module')
def good_workdir(tmp_path_factory):
  """lm_shakespeare:tiny (rotary, max_len 64, byte tokenizer) at step 0:
  config.json, tokenizer/ and one checkpoint, as train.py writes them."""
  path = str(tmp_path_factory.mktemp('lm') / 'run')
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = str(tmp_path_factory.mktemp('unprepared'))
  tokenizer = data.ByteTokenizer()
  setup = model_setup.build(Experiment.of(cfg), tokenizer.vocab_size)
  saved = Experiment.of(cfg)
  checkpoint.save_side_files(path, saved.saved_form(), saved.data,
                             tokenizer)
  saver = checkpoint.Checkpointer(path, async_save=False)
  saver.save(setup.init_state(cfg.seed), {})
  saver.wait()
  saver.close()
  return path


def edit_config(workdir, section='model', **fields):
  """Changes fields of config.json's model (or another section)."""
  path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  with open(path) as f:
    cfg = json.load(f)
  cfg[section].update(fields)
  with open(path, 'w') as f:
    json.dump(cfg, f)


def truncate_params(workdir):
  """Every file of the checkpoint's parameters emptied (a torn write)."""
  for root, _, files in os.walk(os.path.join(workdir, 'checkpoints', '0',
                                             'params')):
    for name in files:
      open(os.path.join(root, name), 'w').close()


def halve_arrays(workdir):
  """The arrays' data files cut in half; the metadata stays readable."""
  top = os.path.join(workdir, 'checkpoints', '0', 'params', 'ocdbt.process_0')
  for root, _, files in os.walk(top):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        blob = f.read()
      with open(path, 'wb') as f:
        f.write(blob[:len(blob) // 2])


@functools.cache
def sentencepiece():
  return data.SentencePieceTokenizer.train(
      [data_testing.fake_play('macbeth')], 400)


def other_tokenizer(workdir):
  """A SentencePiece tokenizer of 400 pieces in place of the bytes one."""
  shutil.rmtree(os.path.join(workdir, workdir_lib.TOKENIZER_DIR))
  sentencepiece().save(os.path.join(workdir, workdir_lib.TOKENIZER_DIR))


# (how to break a copy of the good workdir, what the sentence must say)
BROKEN = {
    'missing': (lambda w: shutil.rmtree(w), 'is not a directory'),
    'empty': (lambda w: [shutil.rmtree(os.path.join(w, x))
                         for x in ('checkpoints', 'tokenizer')]
              + [os.remove(os.path.join(w, 'config.json'))],
              'has no config.json: not a training workdir'),
    'no_checkpoint': (lambda w: shutil.rmtree(os.path.join(w, 'checkpoints')),
                      'holds no checkpoint yet'),
    'no_tokenizer': (lambda w: shutil.rmtree(os.path.join(w, 'tokenizer')),
                     'has no tokenizer/ directory'),
    'bad_tokenizer': (lambda w: open(os.path.join(w, 'tokenizer',
                                                  'tokenizer.json'),
                                     'w').close(),
                      'cannot be read as a tokenizer'),
    'other_tokenizer': (other_tokenizer, 'no longer matches its fingerprint'),
    'other_tokenizer_unrecorded': (
        lambda w: [other_tokenizer(w),
                   os.remove(os.path.join(w, workdir_lib.FINGERPRINT_FILE))],
        'holds embed.embedding with shape (264, 32), this config builds ('),
    'bad_json': (lambda w: open(os.path.join(w, 'config.json'), 'w').write(
        '{"model": '), 'config.json is not valid JSON'),
    'wider': (lambda w: edit_config(w, d_model=64, num_heads=2),
              'holds embed.embedding with shape (264, 32), this config '
              'builds (264, 64): the model config changed'),
    'deeper': (lambda w: edit_config(w, num_decoder_layers=2),
               'holds layers.1.'),
    'small_vocab': (lambda w: edit_config(w, vocab_size=100),
                    "config.model.vocab_size=100 is smaller than the "
                    "tokenizer's 260"),
    'torn': (truncate_params, 'has no readable list of parameters '
             '(JSONDecodeError: '),
    'corrupt': (halve_arrays, 'cannot be read (ValueError: OUT_OF_RANGE: '
                'Error reading "'),
}


@pytest.fixture(params=sorted(BROKEN))
def broken(request, good_workdir, tmp_path):
  """(a broken copy of the good workdir, the words its refusal must hold)."""
  path = str(tmp_path / request.param)
  shutil.copytree(good_workdir, path)
  breaking, needle = BROKEN[request.param]
  breaking(path)
  return path, needle


def refused(capsys, code, prog):
  """The single stderr line of a script that exited with status 2."""
  err = capsys.readouterr().err
  assert code == 2, err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'{prog}: error: '), err
  return lines[0]


def test_generate_refuses_a_broken_workdir(broken, capsys):
  path, needle = broken
  code = GENERATE.main(['--workdir', path, '--input', 'abc'])
  assert needle in refused(capsys, code, 'generate.py')


def test_export_refuses_a_broken_workdir_and_writes_nothing(broken, capsys,
                                                            tmp_path):
  path, needle = broken
  out = tmp_path / 'model.safetensors'
  code = EXPORT.main(['--workdir', path, '--format', 'safetensors', '--out',
                      str(out)])
  assert needle in refused(capsys, code, 'export.py')
  assert not out.exists()


def test_the_library_raises_the_same_sentence(broken):
  path, needle = broken
  with pytest.raises(UsageError) as err:
    restore.load_for_inference(path)
  assert needle in str(err.value)


@pytest.mark.parametrize('name', ['no_checkpoint', 'wider', 'corrupt'])
def test_evaluate_refuses_a_broken_workdir(name, good_workdir, fake_data_dir,
                                           tmp_path, capsys):
  path = str(tmp_path / name)
  shutil.copytree(good_workdir, path)
  breaking, needle = BROKEN[name]
  breaking(path)
  # The split is found before a checkpoint is read: point at prepared data.
  edit_config(path, section='data', data_dir=fake_data_dir)
  code = EVALUATE.main(['--workdir', path])
  assert needle in refused(capsys, code, 'evaluate.py')


def test_evaluate_names_unprepared_data_in_one_line(good_workdir, capsys):
  code = EVALUATE.main(['--workdir', good_workdir])
  line = refused(capsys, code, 'evaluate.py')
  assert "'shakespeare' is not prepared under" in line
  assert 'python scripts/prepare_data.py --dataset shakespeare' in line


# ----------------------------------------------------------------------------
# Texts and ids that the model cannot take.


@pytest.mark.parametrize('argv, needle', [
    (['--input', ' '], '--input is empty'),
    (['--input', 'a' * 80], "--input is 80 tokens long, more than the "
     "model's max_len=64; shorten it."),
    (['--input', 'abc', '--max_new_tokens', '0'], '--max_new_tokens must be'),
    (['--input', 'abc', '--top_p', '2'], '--top_p must be in (0, 1]'),
    (['--input', 'abc', '--beam_size', 'x'], "invalid int value: 'x'"),
])
def test_generate_refuses_bad_input_with_a_real_checkpoint(
    argv, needle, good_workdir, capsys):
  try:
    code = GENERATE.main(['--workdir', good_workdir, *argv])
  except SystemExit as e:  # argparse's own errors, made one line
    code = e.code
  assert needle in refused(capsys, code, 'generate.py')


def tiny_lm():
  exp = Experiment.of(load_config('lm_shakespeare:tiny'))
  return DecoderLM(exp.model_config(data.ByteTokenizer().vocab_size))


@pytest.mark.parametrize('prompt, needle', [
    ([[1, 300]], "prompt_ids holds token id 300, outside the model's "
     'vocabulary [0, 264)'),
    ([[1, -1]], 'holds token id -1'),
    (np.zeros((1, 0), np.int32), 'prompt_ids is empty'),
    ([[0, 0]], 'Row 0 of prompt_ids has no real tokens'),
    ([[5] * 65], "prompt_ids has length 65, longer than the model's "
     'max_len=64'),
    ([[1.5, 2.0]], 'must hold integer token ids'),
])
def test_decoding_refuses_bad_ids_before_compiling(prompt, needle):
  with pytest.raises(UsageError) as err:
    decoding.generate(tiny_lm(), prompt_ids=prompt, max_new_tokens=2)
  assert needle in str(err.value)


def test_decode_texts_names_the_text_that_does_not_fit():
  with pytest.raises(UsageError, match="Text 2 is 71 tokens long"):
    inference.decode_texts(tiny_lm(), data.ByteTokenizer(),
                           ['fine', 'x' * 70])


def test_trained_refuses_a_step_it_does_not_have(good_workdir):
  with pytest.raises(UsageError, match=r'has no checkpoint at step 5; it '
                     r'has steps \[0\]'):
    restore.load(good_workdir, step=5)
  with pytest.raises(UsageError, match='Cannot average the last 2'):
    restore.choose_steps(restore.open_workdir(good_workdir), None, 2)


@pytest.mark.slow
def test_generate_cli_refuses_a_missing_workdir_in_a_real_process(tmp_path):
  env = dict(os.environ, PYTHONPATH=repo.ROOT, JAX_PLATFORMS='cpu')
  proc = subprocess.run(
      [sys.executable, os.path.join(repo.ROOT, 'scripts', 'generate.py'),
       '--workdir', str(tmp_path / 'nope'), '--input', 'hello'],
      env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().splitlines() == [
      f'generate.py: error: --workdir {tmp_path / "nope"} is not a '
      'directory; give a training workdir.']
  assert proc.stdout == ''

