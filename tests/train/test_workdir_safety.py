"""A workdir is never lost or silently replaced: object storage, unwritable
or full disks, tokenizer fingerprints, checkpoints of another model, failed
background saves, bad configs refused before data preparation, and stop
signals during evaluation."""

import json
import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_transformer.cli import load_config
from jax_transformer.data.tokenizers import (
  ByteTokenizer,
  SentencePieceTokenizer,
  fingerprint,
  make_tokenizer,
)
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.model.params import split
from jax_transformer.runtime import faults, storage
from jax_transformer.train import (
  checkpoint,
  metrics,
  perf,
  scores,
  trainer,
)
from jax_transformer.workdirs import restore


def _tiny(tmp_path, **fields):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = str(tmp_path / 'tfds')
  cfg.sample.enabled = False
  cfg.update(fields)
  return cfg


@pytest.fixture
def no_data_preparation(monkeypatch):
  """Fails the test if the trainer gets as far as preparing data."""
  def refuse(cfg):
    raise AssertionError('data was prepared before the refusal')
  monkeypatch.setattr(trainer, 'prepare_data', refuse)


# ----------------------------------------------------------------------------
# Object storage.

def test_an_unsupported_scheme_is_refused_in_one_sentence():
  for location in ('s3://bucket/run', 'az://box/run'):
    with pytest.raises(UsageError, match=r'not (s3|az)://') as err:
      storage.path(location)
    assert '\n' not in str(err.value)


def test_a_missing_filesystem_package_is_refused_before_any_work(
    tmp_path, monkeypatch, no_data_preparation):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(storage, '_importable', lambda module: False)
  monkeypatch.setattr(storage, '_fsspec_knows', lambda protocol: False)
  with pytest.raises(UsageError, match=r'needs gcsfs and '
                     r'google-cloud-storage .*pip install'):
    trainer.train_and_evaluate(_tiny(tmp_path), 'gs://bucket/run')
  assert not os.path.exists(tmp_path / 'gs:')  # nothing written locally


def test_a_gs_workdir_in_no_bucket_is_refused_before_data_preparation(
    tmp_path, gcs, no_data_preparation):
  """The server answers a write into a missing bucket with 'not found' and
  the request's URL: the refusal names the bucket instead."""
  with pytest.raises(UsageError, match=r'^Cannot write the workdir '
                     r'gs://no-such-bucket/run \(no bucket no-such-bucket '
                     r'that this machine can reach\); choose a writable'):
    trainer.train_and_evaluate(_tiny(tmp_path), 'gs://no-such-bucket/run')
  assert 'no-such-bucket' not in gcs.buckets()  # nor was it made


@pytest.mark.slow
def test_a_gs_workdir_trains_stops_and_resumes_in_the_bucket(
    tmp_path, monkeypatch, gcs, gcs_bucket):
  """On a GCS server (tests/gcs_server.py): every file lands in the
  bucket, none in a local 'gs:' folder; a run stopped by SIGTERM at step 3
  and resumed to 6 ends with the parameters of an uninterrupted local run,
  and the gs:// workdir opens for inference as a local one does."""
  monkeypatch.chdir(tmp_path)
  workdir = f'gs://{gcs_bucket}/run'
  cfg = _tiny(tmp_path, num_steps=6, checkpoint_every=2, log_every=2,
              eval_every=4)
  monkeypatch.setattr(faults, '_planned', faults.parse('SIGTERM@step:3'))
  cut = trainer.train_and_evaluate(cfg, workdir)
  assert cut['interrupted'] == 'SIGTERM'
  saver = checkpoint.Checkpointer(workdir, async_save=False)
  assert saver.latest_step() == 3
  saver.close()
  trainer.train_and_evaluate(cfg, workdir)
  history = metrics.read_history(workdir)
  opened = restore.load_model(workdir)

  names = gcs.objects(gcs_bucket)
  top = {name.split('/')[1] for name in names}
  assert top == {'checkpoints', 'config.json', 'data.json', 'metrics.jsonl',
                 'tensorboard', 'tokenizer', 'tokenizer.sha256'}, names
  steps = {name.split('/')[2] for name in names
           if name.startswith('run/checkpoints/')}
  assert steps == {'3', '4', '6'}, sorted(steps)  # keep_checkpoints=3
  assert not os.path.exists(tmp_path / 'gs:')
  assert [row['step'] for row in history] == [2, 4, 6]

  trainer.train_and_evaluate(cfg, str(tmp_path / 'local'))
  remote = jax.device_get(split(opened.model)[1])
  assert opened.step == 6
  local = _final_params(tmp_path / 'local')
  for name in local:
    np.testing.assert_array_equal(remote[name], local[name], err_msg=name)


def _final_params(workdir):
  model, _ = restore.load_for_inference(str(workdir))
  return jax.device_get(split(model)[1])


# ----------------------------------------------------------------------------
# Unwritable or full disks, bad configs: refused before the work.

def test_an_unwritable_workdir_is_refused_before_data_preparation(
    tmp_path, no_data_preparation):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a folder')
  with pytest.raises(UsageError, match=r'^Cannot write the workdir .*a_file'):
    trainer.train_and_evaluate(_tiny(tmp_path), str(blocker / 'run'))


def test_a_full_disk_is_refused_before_the_first_step(tmp_path, monkeypatch):
  def never_compile(*args):
    raise AssertionError('compiled despite a full disk')
  monkeypatch.setattr(perf, 'compile_timed', never_compile)
  usage = shutil.disk_usage(tmp_path)
  monkeypatch.setattr(storage.shutil, 'disk_usage',
                      lambda path: usage._replace(free=1000))
  with pytest.raises(UsageError, match=r'has 0.00 GiB free, less than one '
                     r'checkpoint needs'):
    trainer.train_and_evaluate(_tiny(tmp_path), str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run' / 'checkpoints' / '0')


@pytest.mark.parametrize('fields, message', [
    ({'model.d_model': 33}, r'd_model=33 is not divisible by num_heads=2'),
    ({'model.num_kv_heads': 3}, r'num_kv_heads=3 must be a positive divisor'),
    ({'mesh.data': 3}, r'needs 3 devices but 8 are available'),
    ({'batch_size': 12, 'mesh.data': 8}, r'Batch size 12 is not divisible'),
    ({'seq_len': 128}, r'seq_len=128 exceeds model.max_len=64'),
    ({'keep_checkpoints': 0}, r'keep_checkpoints must be an integer >= 1'),
    ({'checkpoint_every': 0}, r'checkpoint_every must be an integer >= 1'),
])
def test_a_bad_config_is_refused_before_data_preparation(
    tmp_path, no_data_preparation, fields, message):
  cfg = _tiny(tmp_path)
  for name, value in fields.items():
    section, _, field = name.rpartition('.')
    (cfg[section] if section else cfg)[field] = value
  with pytest.raises(ValueError, match=message) as err:
    trainer.train_and_evaluate(cfg, str(tmp_path / 'run'))
  assert '\n' not in str(err.value)


def test_resume_allows_another_data_dir_but_not_another_model(tmp_path):
  cfg = _tiny(tmp_path)
  saved = Experiment.of(cfg)
  checkpoint.save_side_files(str(tmp_path), saved.saved_form(), saved.data,
                             ByteTokenizer())
  moved = _tiny(tmp_path)
  moved.data.data_dir = str(tmp_path / 'elsewhere')
  moved.model.dropout_rate = 0.3
  trainer.check_resumable(Experiment.of(moved), str(tmp_path))
  wider = _tiny(tmp_path)
  wider.model.d_ff = 128
  with pytest.raises(UsageError, match=r'different config.model \(d_ff\)'):
    trainer.check_resumable(Experiment.of(wider), str(tmp_path))


# ----------------------------------------------------------------------------
# The tokenizer a checkpoint was trained with.

@pytest.fixture(scope='module')
def spm_tokenizers():
  """Two different SentencePiece tokenizers."""
  texts = [f'line {i} of a small corpus about {w}' for i, w in
           enumerate(['cats', 'dogs', 'birds', 'fish'] * 30)]
  a = make_tokenizer('sentencepiece', texts, vocab_size=300)
  b = make_tokenizer('sentencepiece', texts[::-1] + ['zebra quagga'] * 20,
                     vocab_size=310)
  return a, b


def test_fingerprints_tell_tokenizers_apart_and_survive_saving(
    tmp_path, spm_tokenizers):
  a, b = spm_tokenizers
  a.save(tmp_path / 'a')
  from jax_transformer.data.tokenizers import load_tokenizer  # pylint: disable=g-import-not-at-top
  assert fingerprint(load_tokenizer(tmp_path / 'a')) == fingerprint(a)
  assert fingerprint(SentencePieceTokenizer(a._proto)) == fingerprint(a)
  assert len({fingerprint(a), fingerprint(b), fingerprint(ByteTokenizer())}
             ) == 3


def test_the_workdir_tokenizer_is_kept_and_checked(tmp_path, spm_tokenizers):
  a, b = spm_tokenizers
  work = str(tmp_path)
  cfg = _tiny(tmp_path)
  assert checkpoint.run_tokenizer(work, a, has_checkpoint=False) is a
  saved = Experiment.of(cfg)
  checkpoint.save_side_files(work, saved.saved_form(), saved.data, a)
  # Another data directory's tokenizer: the checkpoints' one is used.
  kept = checkpoint.run_tokenizer(work, b, has_checkpoint=True)
  assert fingerprint(kept) == fingerprint(a)
  checkpoint.save_side_files(work, saved.saved_form(), saved.data, kept)
  assert fingerprint(checkpoint.run_tokenizer(work, b, True)) == (
      fingerprint(a))

  # tokenizer/ lost: the data's may stand in only if it is the recorded one.
  shutil.rmtree(tmp_path / 'tokenizer')
  assert checkpoint.run_tokenizer(work, a, has_checkpoint=True) is a
  with pytest.raises(UsageError, match=r'holds checkpoints but not the '
                     r'tokenizer .*differs from the recorded one'):
    checkpoint.run_tokenizer(work, b, has_checkpoint=True)

  # tokenizer/ replaced after training started.
  b.save(tmp_path / 'tokenizer')
  with pytest.raises(UsageError, match=r'no longer matches its fingerprint'):
    checkpoint.run_tokenizer(work, a, has_checkpoint=True)


# ----------------------------------------------------------------------------
# Checkpoints.

def _state(rows, step):
  return {'params': {'w': jnp.full((rows, 3), float(step))},
          'opt_state': {'mu': jnp.zeros((rows, 3))},
          'step': jnp.int32(step), 'rng': jnp.zeros(2, jnp.uint32)}


def _abstract(rows):
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one),
      _state(rows, 0))


def test_a_checkpoint_of_another_model_is_refused_not_skipped(tmp_path):
  """Every step would fail to fit: the newest is named with the parameter,
  rather than each being skipped as torn."""
  saver = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  for step in (1, 2):
    saver.save(_state(4, step), {})
  with pytest.raises(checkpoint.CheckpointMismatch,
                     match=r'^Checkpoint step 2 .* holds w with shape '
                     r'\(4, 3\), this config builds \(5, 3\)'):
    saver.restore(_abstract(5))
  restored, _ = saver.restore(_abstract(4))
  assert int(restored['step']) == 2
  saver.close()


def test_a_failed_background_save_stops_at_the_next_check(tmp_path):
  saver = checkpoint.Checkpointer(str(tmp_path), keep=3)
  saver.save(_state(4, 1), {})
  saver.wait()
  # The checkpoints folder turns into a file: the next write cannot land.
  shutil.rmtree(tmp_path / 'checkpoints')
  (tmp_path / 'checkpoints').write_text('')
  with pytest.raises(checkpoint.SaveFailed, match=r'^Writing a checkpoint '
                     r'to .* failed \((NotADirectoryError|FileExistsError)'):
    saver.save(_state(4, 2), {})
    while True:  # as the trainer does after every step
      saver.check_errors()
  saver.close()



# ----------------------------------------------------------------------------
# A stop signal during evaluation.

def test_a_stop_signal_during_evaluation_saves_without_waiting_for_it(
    tmp_path, monkeypatch):
  """SIGTERM arrives as step 3's evaluation starts: the evaluation is
  abandoned after its first batch, step 3 is saved, and the run reports
  the signal (train.py then exits 75)."""
  batches = []
  evaluate = trainer.evaluate

  def signalled(eval_step, *args, **kwargs):
    def counting(params, batch):
      batches.append(1)
      return eval_step(params, batch)
    signal.raise_signal(signal.SIGTERM)  # handled before it returns
    return evaluate(counting, *args, **kwargs)

  monkeypatch.setattr(trainer, 'evaluate', signalled)
  cfg = _tiny(tmp_path)  # eval_steps=4, eval at step 3 of 6
  last = trainer.train_and_evaluate(cfg, str(tmp_path / 'run'))
  assert last['interrupted'] == 'SIGTERM'
  assert len(batches) == 1
  assert 'eval_loss' not in last
  saver = checkpoint.Checkpointer(str(tmp_path / 'run'), async_save=False)
  assert saver.latest_step() == 3
  saver.close()


def test_a_final_evaluation_cut_by_a_stop_signal_is_finished_on_resume(
    tmp_path, monkeypatch):
  """SIGTERM during the last step's evaluation: the run saves the last
  step and stops; the restart has no step left to train, finishes that
  evaluation and logs it as the uninterrupted run does."""
  cfg = _tiny(tmp_path, num_steps=3)  # eval_steps=4, eval at step 3
  trainer.train_and_evaluate(cfg, str(tmp_path / 'whole'))
  evaluate = trainer.evaluate

  def signalled(*args, **kwargs):
    signal.raise_signal(signal.SIGTERM)  # handled before it returns
    return evaluate(*args, **kwargs)

  with monkeypatch.context() as patch:
    patch.setattr(trainer, 'evaluate', signalled)
    cut = trainer.train_and_evaluate(cfg, str(tmp_path / 'cut'))
  assert cut['interrupted'] == 'SIGTERM' and 'eval_loss' not in cut
  assert 'eval_loss' not in metrics.read_history(tmp_path / 'cut')[-1]
  resumed = trainer.train_and_evaluate(cfg, str(tmp_path / 'cut'))
  assert 'interrupted' not in resumed
  whole = metrics.read_history(tmp_path / 'whole')
  finished = metrics.read_history(tmp_path / 'cut')
  assert [r['step'] for r in finished] == [r['step'] for r in whole] == [3]
  for name in ('loss', 'grad_norm', 'learning_rate', 'eval_loss'):
    assert finished[-1][name] == whole[-1][name], name
  # Each start logged step 3, then it again with the start's times. A
  # third start finds nothing left to do and logs nothing more.
  assert len(metrics.read_jsonl(tmp_path / 'cut')) == 4
  trainer.train_and_evaluate(cfg, str(tmp_path / 'cut'))
  assert len(metrics.read_jsonl(tmp_path / 'cut')) == 4


def test_loss_metrics_stops_between_batches_when_asked(tmp_path):
  asked = []

  def stop(done):
    asked.append(done)
    return done == 2

  cfg = _tiny(tmp_path)
  prepared = trainer.prepare_data(cfg)
  mesh = jax.make_mesh((jax.device_count(), 1, 1), ('data', 'fsdp', 'tensor'))
  step = lambda params, batch: {'nll': jnp.float32(1.0),  # noqa: E731
                                'tokens': jnp.float32(1.0)}
  with pytest.raises(scores.Interrupted):
    scores.loss_metrics(step, {}, Experiment.of(cfg).data,
                            prepared.tokenizer, mesh,
                            (cfg.eval_batch_size, cfg.seq_len),
                            max_batches=4, stop=stop)
  assert asked == [1, 2]


def test_a_workdir_saved_before_new_data_fields_still_resumes(tmp_path):
  """Fields added to config.data since a run was saved (unset now) do not
  make it another run; a field that differs still does."""
  cfg = load_config('lm_shakespeare:tiny')
  saved = json.loads(cfg.to_json())
  for name in ('mixture', 'text_key', 'train_files'):
    saved['data'].pop(name, None)
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  trainer.check_resumable(Experiment.of(cfg), str(tmp_path))
  cfg.data.name = 'tiny_shakespeare'
  with pytest.raises(UsageError, match=r'different config\.data \(name\)'):
    trainer.check_resumable(Experiment.of(cfg), str(tmp_path))
