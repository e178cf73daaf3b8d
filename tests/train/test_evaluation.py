"""scripts/evaluate.py and jax_transformer.train.scores: BLEU as sacrebleu
scores the written files, LM loss as an independent computation, checkpoint
averaging, batched translation equal to one-by-one decoding, bad input."""

import contextlib
import io
import json
import math
import os
import shutil

import evaluate as evaluate_script
import jax
import numpy as np
import pytest
import sacrebleu

from jax_transformer import data, decoding
from jax_transformer.cli import load_config
from jax_transformer.data import splits
from jax_transformer.data import testing as data_testing
from jax_transformer.model import sharding
from jax_transformer.train import scores, trainer
from jax_transformer.workdirs import restore

PLAYS = ('macbeth',)

# One xdist worker for the module: ende_workdir and lm_workdir (trainings)
# are built once, not once per worker that runs one of their tests.
pytestmark = pytest.mark.xdist_group('evaluation')


@pytest.fixture(scope='module')
def data_dir(fake_data_dir):
  """Macbeth (PLAYS) and the fake Ding pairs, BPE 500 (conftest.py)."""
  return fake_data_dir


def _train(cfg, workdir):
  cfg.sample.enabled = False
  cfg.checkpoint_every = 1
  cfg.keep_checkpoints = 10
  trainer.train_and_evaluate(cfg, workdir)
  return workdir


@pytest.fixture(scope='module')
def ende_workdir(data_dir, tmp_path_factory):
  cfg = load_config('translate_ende:tiny')
  cfg.data.update(data_dir=data_dir, vocab_size=500, spm_model_type='bpe')
  cfg.eval_bleu_examples = 4
  return _train(cfg, str(tmp_path_factory.mktemp('ende')))


@pytest.fixture(scope='module')
def lm_workdir(data_dir, tmp_path_factory):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = data_dir
  cfg.num_steps = 4
  cfg.eval_every = cfg.log_every = 2
  return _train(cfg, str(tmp_path_factory.mktemp('lm')))


def run_script(*argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = evaluate_script.main([str(a) for a in argv])
  return code, out.getvalue(), err.getvalue()


def read_lines(directory, name):
  with open(os.path.join(directory, name)) as f:
    return f.read().splitlines()


@pytest.mark.slow
def test_training_logged_bleu(ende_workdir):
  with open(os.path.join(ende_workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  evals = [r for r in rows if 'eval_loss' in r]
  assert evals and all('eval_bleu' in r and 'eval_chrf' in r for r in evals)


@pytest.mark.slow
def test_bleu_equals_sacrebleu_on_the_written_files(ende_workdir,
                                                    monkeypatch):
  translate = scores.translate

  def half_right(model, tokenizer, sources, **kwargs):
    # Half the outputs are the references, so the score is far from 0.
    hyps = translate(model, tokenizer, sources, **kwargs)
    _, refs = scores.split_texts(restore.open_workdir(
        ende_workdir).config.data, 'validation', len(sources))
    return [r if i % 2 else h for i, (h, r) in enumerate(zip(hyps, refs))]

  monkeypatch.setattr(scores, 'translate', half_right)
  code, out, err = run_script('--workdir', ende_workdir, '--max_examples', 12,
                              '--beam_size', 2, '--batch_size', 8)
  assert code == 0, err
  result = json.loads(out)
  directory = result['output_dir']
  assert directory == os.path.join(ende_workdir, 'eval', 'validation-step4')
  hyps = read_lines(directory, 'hypotheses.txt')
  refs = read_lines(directory, 'references.txt')
  srcs = read_lines(directory, 'sources.txt')
  pairs = data_testing.fake_ding_pairs()
  metrics = result['metrics']
  # The fixture's validation split is smaller than 12.
  assert len(hyps) == len(refs) == len(srcs) == metrics['examples'] >= 8
  assert set(zip(srcs, refs)) <= set(pairs)  # raw text, en -> de
  assert metrics['bleu'] > 10
  assert metrics['bleu'] == pytest.approx(
      sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
  assert metrics['chrf'] == pytest.approx(
      sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
  assert metrics['bleu_signature'].startswith('nrefs:1|case:mixed')
  with open(os.path.join(directory, 'metrics.json')) as f:
    assert json.load(f)['metrics'] == metrics
  assert result['settings']['beam_size'] == 2


@pytest.mark.slow
def test_batched_translation_equals_one_by_one(ende_workdir):
  wd = restore.open_workdir(ende_workdir)
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 1, 'tensor': 1},
                            jax.devices()[:2])
  model = wd.model(restore.restore_params(wd, [wd.steps[-1]], mesh))
  sources, _ = scores.split_texts(wd.config.data, 'validation', 10)
  batched = scores.translate(model, wd.tokenizer, sources, batch_size=4,
                                 mesh=mesh)
  for text, got in zip(sources, batched):
    ids = data.translation_source(wd.tokenizer.encode(text))
    out = decoding.generate(model, src_ids=np.array([ids]),
                            max_new_tokens=len(ids) + 50)
    tokens = decoding.row_tokens(out, 0)
    assert got == wd.tokenizer.decode(
        [t for t in tokens if t != data.EOS_ID]), text


def test_lm_perplexity_equals_independent_mean_token_loss(lm_workdir):
  code, out, err = run_script('--workdir', lm_workdir, '--batch_size', 8)
  assert code == 0, err
  metrics = json.loads(out)['metrics']
  # Independently: the model's log-softmax on every validation window.
  wd = restore.open_workdir(lm_workdir)
  mesh = sharding.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 1},
                            jax.devices()[:1])
  model = wd.model(restore.restore_params(wd, [wd.steps[-1]], mesh))
  tokens = splits.stream_tokens(
      data.load_source('shakespeare', 'validation', wd.config.data.data_dir),
      data.get_spec('shakespeare'), wd.tokenizer)
  t = wd.config.seq_len
  nll, count = 0.0, 0
  for i in range(data.batching.num_lm_windows(len(tokens), t)):
    window = tokens[i * t:i * t + t + 1]
    logits = np.asarray(model(window[None, :-1]), np.float64)[0]
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)
                                  ).sum(-1, keepdims=True)) - logits.max(
                                      -1, keepdims=True)
    nll -= logp[np.arange(t), window[1:]].sum()
    count += t
  assert metrics['tokens'] == count
  assert metrics['loss'] == pytest.approx(nll / count, rel=1e-5)
  assert metrics['perplexity'] == pytest.approx(math.exp(nll / count),
                                                rel=1e-5)
  # Byte tokenizer: every scored token is one byte.
  assert metrics['bytes'] == count
  assert metrics['bits_per_byte'] == pytest.approx(
      nll / count / math.log(2), rel=1e-5)


def test_averaging_identical_checkpoints_gives_the_same_parameters(
    lm_workdir, tmp_path):
  copy = str(tmp_path / 'lm')
  shutil.copytree(lm_workdir, copy)
  ckpt = os.path.join(copy, 'checkpoints')
  last = max(int(s) for s in os.listdir(ckpt) if s.isdigit())
  for step in (last + 1, last + 2):
    shutil.copytree(os.path.join(ckpt, str(last)), os.path.join(ckpt,
                                                                str(step)))
  wd = restore.open_workdir(copy)
  mesh = sharding.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 1},
                            jax.devices()[:1])
  one = restore.restore_params(wd, [last], mesh)
  assert restore.choose_steps(wd, average_last=3) == [last, last + 1,
                                                      last + 2]
  mean = restore.restore_params(wd, [last, last + 1, last + 2], mesh)
  for k, v in one.items():
    np.testing.assert_array_equal(np.asarray(mean[k]), np.asarray(v), k)
  # Two different checkpoints average to their elementwise mean.
  first = restore.restore_params(wd, [1], mesh)
  both = restore.restore_params(wd, [1, last], mesh)
  for k, v in both.items():
    np.testing.assert_allclose(
        np.asarray(v), (np.asarray(first[k], np.float64)
                        + np.asarray(one[k], np.float64)) / 2, rtol=1e-6,
        err_msg=k)


@pytest.mark.parametrize('argv, needle', [
    (['--workdir', '{missing}'], 'is not a directory'),
    (['--workdir', '{empty}'], 'not a training workdir'),
    (['--workdir', '{lm}', '--step', '99'], 'no checkpoint at step 99'),
    (['--workdir', '{lm}', '--average_last', '50'],
     'Cannot average the last 50'),
    (['--workdir', '{lm}', '--split', 'test'], "no split 'test'"),
    (['--workdir', '{lm}', '--beam_size', '0'], '--beam_size must be'),
])
def test_bad_input_is_one_sentence(argv, needle, lm_workdir, tmp_path):
  (tmp_path / 'empty').mkdir()
  argv = [a.format(missing=tmp_path / 'nope', empty=tmp_path / 'empty',
                   lm=lm_workdir) for a in argv]
  code, _, err = run_script(*argv)
  assert code == 2
  assert len(err.strip().splitlines()) == 1, err
  assert needle in err
