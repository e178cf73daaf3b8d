"""scripts/launch/tpu_vm.sh issues the gcloud commands docs/launch.md
describes (a stand-in gcloud on PATH records them)."""

import os
import subprocess

import repo

SCRIPT = os.path.join(repo.SCRIPTS, 'launch', 'tpu_vm.sh')


def run(tmp_path, *args, **env):
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  log = tmp_path / 'gcloud.log'
  gcloud = bin_dir / 'gcloud'
  # One line per call: a --command's newlines become spaces.
  gcloud.write_text('#!/bin/sh\nprintf "%s" "$*" | tr "\\n" " " '
                    '>> "$GCLOUD_LOG"\necho >> "$GCLOUD_LOG"\n')
  gcloud.chmod(0o755)
  full_env = {**os.environ, 'PATH': f'{bin_dir}:{os.environ["PATH"]}',
              'GCLOUD_LOG': str(log), 'TPU_NAME': 'lm-run',
              'ZONE': 'us-east5-a', 'TYPE': 'v5p-128',
              'RUNTIME': 'v2-alpha-tpuv5', **env}
  out = subprocess.run(['bash', SCRIPT, *args], env=full_env,
                       capture_output=True, text=True, timeout=60)
  calls = ([line.strip() for line in log.read_text().splitlines()]
           if log.exists() else [])
  log.unlink(missing_ok=True)
  return out, calls


def test_each_step_is_one_gcloud_command_on_the_slice(tmp_path):
  out, calls = run(tmp_path, 'create')
  assert out.returncode == 0, out.stderr
  assert calls == ['compute tpus queued-resources create lm-run --node-id '
                   'lm-run --zone us-east5-a --accelerator-type v5p-128 '
                   '--runtime-version v2-alpha-tpuv5']
  _, calls = run(tmp_path, 'install')
  assert calls[0].startswith('compute tpus tpu-vm ssh lm-run --zone '
                             'us-east5-a --worker=all --command')
  assert "pip install -q -e '.[tpu]'" in calls[0]
  assert 'python3.11 -m venv' in calls[0]
  _, calls = run(tmp_path, 'train', '--config', 'lm_1_3b', '--workdir',
                 'gs://b/runs/my run')
  assert '--worker=all' in calls[0]
  assert ('train_until_done.sh --config lm_1_3b --workdir gs://b/runs/my\\ '
          'run > ~/train.log') in calls[0]
  _, calls = run(tmp_path, 'stop')
  assert "pkill -TERM -f 'train_until_done.sh|train.py'" in calls[0]
  _, calls = run(tmp_path, 'delete')
  assert calls == ['compute tpus queued-resources delete lm-run --zone '
                   'us-east5-a --force --quiet']


def test_an_unknown_step_or_missing_setting_is_one_line(tmp_path):
  out, calls = run(tmp_path, 'launch')
  assert out.returncode == 2 and not calls
  assert out.stderr.strip().count('\n') == 0
  out, calls = run(tmp_path, 'create', TYPE='')
  assert out.returncode != 0 and not calls and 'set TYPE' in out.stderr
