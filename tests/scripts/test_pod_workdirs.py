"""What a pod trained, scored, decoded, exported and plotted elsewhere: the
scripts take a gs:// workdir as training does (on a GCS server,
tests/gcs_server.py), and a model restored over this host's 8 CPU devices
(sharded on 'fsdp', as lm_7b trains) decodes the same tokens and exports
the same tensors, bit for bit, as on one device.

The workdir is tests/fixtures/workdir_v1_flat (lm_shakespeare:tiny, 3
steps), copied, so nothing here trains."""

import contextlib
import io
import json
import os
import shutil

import jax
import numpy as np
import pytest
import repo
import script_helpers
import xla_flags

from jax_transformer.model import params as params_lib
from jax_transformer.workdirs import exporter, restore

FIXTURE = os.path.join(repo.FIXTURES, 'workdir_v1_flat')
PROMPT = 'ROMEO:'
EVALUATE, GENERATE, EXPORT, PLOT = (
    script_helpers.load_script(name)
    for name in ('evaluate', 'generate', 'export', 'plot_metrics'))


def copy_fixture(target, data_dir, **mesh):
  """The fixture workdir at target, reading data_dir, trained (as its
  config.json says) on mesh."""
  shutil.copytree(FIXTURE, target)
  path = os.path.join(target, 'config.json')
  with open(path) as f:
    cfg = json.load(f)
  cfg['data']['data_dir'] = data_dir
  cfg['mesh'].update(mesh)
  with open(path, 'w') as f:
    json.dump(cfg, f)
  return str(target)


@pytest.fixture(scope='module')
def fsdp_workdir(tmp_path_factory, fake_data_dir):
  """Trained with the parameters over every device on 'fsdp' (lm_7b's
  mesh), so that restored here they are split over all 8."""
  return copy_fixture(tmp_path_factory.mktemp('pod') / 'run', fake_data_dir,
                      data=1, fsdp=-1)


def call(script, argv, **kwargs):
  """(exit status, stdout, stderr) of script.main(argv) in-process."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = script.main([str(a) for a in argv], **kwargs)
  return code, out.getvalue(), err.getvalue()


def ok(script, argv, **kwargs):
  code, out, err = call(script, argv, **kwargs)
  assert code == 0, err[-3000:]
  return out


def loader(devices):
  return lambda workdir: GENERATE._load(workdir, devices)


ONE_DEVICE = jax.local_devices()[:1]


# ----------------------------------------------------------------------------
# Sharded over this host's devices.


def test_the_fsdp_trained_model_is_restored_over_all_8_devices(fsdp_workdir):
  trained = restore.load_model(fsdp_workdir)
  assert dict(trained.mesh.shape) == {'data': 1, 'fsdp': 8, 'sequence': 1,
                                      'tensor': 1}
  embedding = params_lib.split(trained.model)[1]['embed.embedding']
  assert len(embedding.sharding.device_set) == 8
  # Each device holds an eighth of it, not a copy.
  assert embedding.addressable_shards[0].data.shape == (
      embedding.shape[0], embedding.shape[1] // 8)
  alone = restore.load_model(fsdp_workdir, devices=ONE_DEVICE)
  assert alone.mesh.devices.size == 1


@pytest.mark.parametrize('flags', [[], ['--beam_size', '3'],
                                   ['--temperature', '0.9', '--seed', '3']],
                         ids=['greedy', 'beam', 'sampled'])
def test_generate_sharded_gives_the_tokens_of_one_device(fsdp_workdir, flags):
  argv = ['--workdir', fsdp_workdir, '--input', PROMPT,
          '--max_new_tokens', '24', *flags]
  sharded = ok(GENERATE, argv)  # the script's own loader: all 8 devices
  alone = ok(GENERATE, argv, load=loader(ONE_DEVICE))
  assert sharded.startswith(PROMPT) and len(sharded) > len(PROMPT) + 1
  assert sharded == alone


def test_generate_a_file_sharded_equals_one_device(fsdp_workdir, tmp_path):
  # Three lines, batches of two: the batch is padded to the mesh's data
  # axis and the last one is partial.
  (tmp_path / 'in.txt').write_text('ROMEO:\nJULIET: O\nTo be\n')
  outs = []
  for name, load in (('8', None), ('1', loader(ONE_DEVICE))):
    ok(GENERATE, ['--workdir', fsdp_workdir, '--input_file',
                  tmp_path / 'in.txt', '--output_file', tmp_path / name,
                  '--batch_size', '2', '--max_new_tokens', '8'],
       **({'load': load} if load else {}))
    outs.append((tmp_path / name).read_text())
  assert outs[0] == outs[1] and outs[0].count('\n') == 3


def test_export_sharded_writes_the_tensors_of_one_device(fsdp_workdir,
                                                        tmp_path):
  ok(EXPORT, ['--workdir', fsdp_workdir, '--format', 'safetensors',
              '--out', tmp_path / 'sharded.safetensors', '--verify'])
  alone = restore.load_model(fsdp_workdir, devices=ONE_DEVICE)
  exporter.write(alone, 'safetensors', str(tmp_path / 'one.safetensors'))
  sharded, meta = exporter.read_safetensors(str(tmp_path /
                                                'sharded.safetensors'))
  one, _ = exporter.read_safetensors(str(tmp_path / 'one.safetensors'))
  assert meta['step'] == '3' and sorted(sharded) == sorted(one)
  for name in one:
    assert sharded[name].tobytes() == one[name].tobytes(), name


def test_on_host_gathers_without_changing_the_model(fsdp_workdir):
  trained = restore.load_model(fsdp_workdir)
  host = exporter.on_host(trained)
  before = params_lib.split(trained.model)[1]
  after = params_lib.split(host.model)[1]
  assert all(isinstance(v, np.ndarray) for v in after.values())
  for name, value in before.items():
    np.testing.assert_array_equal(after[name], jax.device_get(value))
  # The model given is left sharded (verify runs it there).
  assert len(before['embed.embedding'].sharding.device_set) == 8


# ----------------------------------------------------------------------------
# gs:// workdirs.


@pytest.fixture
def bucket(tmp_path, monkeypatch, fake_data_dir, gcs, gcs_bucket):
  """gs://BUCKET/run: the fixture workdir in a bucket of the GCS server;
  yields (that URL, a local copy of the same workdir)."""
  monkeypatch.chdir(tmp_path)
  local = copy_fixture(tmp_path / 'local', fake_data_dir)
  gcs.upload(local, gcs_bucket, 'run')
  yield f'gs://{gcs_bucket}/run', local
  assert not os.path.exists(tmp_path / 'gs:')  # nothing under a local 'gs:'


def test_evaluate_scores_a_gs_workdir_and_writes_into_it(bucket, gcs,
                                                         gcs_bucket):
  remote, local = bucket
  got = json.loads(ok(EVALUATE, ['--workdir', remote]))
  want = json.loads(ok(EVALUATE, ['--workdir', local]))
  assert got['metrics'] == want['metrics'] and got['step'] == 3
  assert got['output_dir'] == f'{remote}/eval/validation-step3'
  written = gcs.read(gcs_bucket, 'run/eval/validation-step3/metrics.json')
  assert json.loads(written) == got


def test_lm_eval_tasks_score_a_gs_workdir_and_write_into_it(bucket, gcs,
                                                            gcs_bucket):
  """From another directory (the bundled tasks are found from any)."""
  remote, local = bucket
  args = ['--tasks', 'shakespeare_next_line', '--limit', '4']
  got = ok(EVALUATE, ['--workdir', remote, *args])
  want = ok(EVALUATE, ['--workdir', local, *args])
  assert '|shakespeare_next_line|' in got and got == want
  written = json.loads(gcs.read(gcs_bucket,
                                'run/eval/harness-step3/results.json'))
  assert written['results']['shakespeare_next_line']['acc,none'] in (
      0, 0.25, 0.5, 0.75, 1)


def test_generate_decodes_a_gs_workdir(bucket, gcs, gcs_bucket):
  remote, local = bucket
  argv = ['--input', PROMPT, '--max_new_tokens', '12']
  got = ok(GENERATE, ['--workdir', remote, *argv])
  assert got == ok(GENERATE, ['--workdir', local, *argv])
  # Files in the bucket too, both ways.
  gcs.write(gcs_bucket, 'prompts.txt', b'ROMEO:\nTo be\n')
  ok(GENERATE, ['--workdir', remote, '--input_file',
                f'gs://{gcs_bucket}/prompts.txt', '--output_file',
                f'gs://{gcs_bucket}/out.txt', '--max_new_tokens', '12'])
  lines = gcs.read(gcs_bucket, 'out.txt').decode().split('\n')
  assert lines[0] == got.rstrip('\n') and len(lines) == 3  # and ''


def test_serve_answers_from_a_gs_workdir_as_generate_does(bucket):
  from serving.server_process import Server
  remote, local = bucket
  server = Server(remote, key=None)
  try:
    status, answer = server.post('/v1/completions', {
        'model': 'run', 'prompt': PROMPT, 'max_tokens': 12,
        'temperature': 0})
  finally:
    assert server.stop() == 0, server.output()
  assert status == 200, answer
  expected = ok(GENERATE, ['--workdir', local, '--input', PROMPT,
                           '--max_new_tokens', '12'])
  assert PROMPT + answer['choices'][0]['text'] == expected.rstrip('\n')


def test_export_writes_a_gs_workdir_as_a_local_one(bucket, tmp_path):
  remote, local = bucket
  out = ok(EXPORT, ['--workdir', remote, '--format', 'safetensors',
                    '--out', tmp_path / 'remote.safetensors'])
  assert f'from step 3 of {remote}' in out
  ok(EXPORT, ['--workdir', local, '--format', 'safetensors',
              '--out', tmp_path / 'local.safetensors'])
  got, _ = exporter.read_safetensors(str(tmp_path / 'remote.safetensors'))
  want, _ = exporter.read_safetensors(str(tmp_path / 'local.safetensors'))
  assert sorted(got) == sorted(want)
  for name in want:
    assert got[name].tobytes() == want[name].tobytes(), name


def test_plot_reads_a_gs_workdir_and_writes_into_the_bucket(bucket, gcs,
                                                           gcs_bucket):
  remote, local = bucket
  ok(PLOT, [remote, local, '--out', f'gs://{gcs_bucket}/curves.png'])
  assert gcs.read(gcs_bucket, 'curves.png')[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('script,argv', [
    (EVALUATE, ['--workdir', 'NOPE']),
    (GENERATE, ['--workdir', 'NOPE', '--input', PROMPT]),
    (EXPORT, ['--workdir', 'NOPE', '--format', 'safetensors',
              '--out', 'x.safetensors']),
    (PLOT, ['NOPE', '--out', 'x.png']),
], ids=['evaluate', 'generate', 'export', 'plot'])
def test_a_missing_gs_workdir_is_one_sentence(bucket, script, argv):
  nope = bucket[0].replace('/run', '/nope')
  code, out, err = call(script, [nope if a == 'NOPE' else a for a in argv])
  assert code == 2 and not out
  assert err.count('\n') == 1 and nope in err
  assert 'is not a directory' in err, err


# ----------------------------------------------------------------------------
# As a user runs them: a process of 8 CPU devices.


@pytest.mark.slow
def test_the_scripts_over_8_devices_equal_one_device(fsdp_workdir, tmp_path):
  eight = {'XLA_FLAGS': xla_flags.cpu(8)}
  argv = ['--workdir', fsdp_workdir, '--input', PROMPT,
          '--max_new_tokens', '24']
  run = script_helpers.run_script('generate', *argv, env=eight)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout == ok(GENERATE, argv, load=loader(ONE_DEVICE))

  out = tmp_path / 'eight.safetensors'
  run = script_helpers.run_script(
      'export', '--workdir', fsdp_workdir, '--format', 'safetensors',
      '--out', str(out), env=eight)
  assert run.returncode == 0, run.stderr[-3000:]
  exporter.write(restore.load_model(fsdp_workdir, devices=ONE_DEVICE),
                 'safetensors', str(tmp_path / 'one.safetensors'))
  got, _ = exporter.read_safetensors(str(out))
  want, _ = exporter.read_safetensors(str(tmp_path / 'one.safetensors'))
  assert sorted(got) == sorted(want)
  for name in want:
    assert got[name].tobytes() == want[name].tobytes(), name
