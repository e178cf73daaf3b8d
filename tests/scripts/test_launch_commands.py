"""The launch scripts issue the commands docs/launch.md describes: stand-in
gcloud, srun, scontrol and ssh on PATH record them (the runs these start
are tested in test_launch_scripts.py and tests/runtime)."""

import os
import subprocess

import repo

LAUNCH = os.path.join(repo.SCRIPTS, 'launch')
SCRIPT = os.path.join(LAUNCH, 'tpu_vm.sh')


def run(tmp_path, *args, script=SCRIPT, status=0, **env):
  """script run with stand-ins that record each call as a line of
  'NAME ARGS' (newlines in ARGS as spaces) and exit with status."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  log = tmp_path / 'calls.log'
  for name in ('gcloud', 'srun', 'scontrol', 'ssh'):
    stand_in = bin_dir / name
    stand_in.write_text(
        f'#!/bin/sh\nprintf "{name} %s" "$*" | tr "\\n" " " >> "$CALLS"\n'
        f'echo >> "$CALLS"\nexit {status}\n')
    stand_in.chmod(0o755)
  full_env = {**os.environ, 'PATH': f'{bin_dir}:{os.environ["PATH"]}',
              'CALLS': str(log), 'TPU_NAME': 'lm-run',
              'ZONE': 'us-east5-a', 'TYPE': 'v5p-128',
              'RUNTIME': 'v2-alpha-tpuv5', **env}
  out = subprocess.run(['bash', script, *args], env=full_env,
                       capture_output=True, text=True, timeout=60)
  calls = ([line.strip() for line in log.read_text().splitlines()]
           if log.exists() else [])
  log.unlink(missing_ok=True)
  return out, calls


def test_each_step_is_one_gcloud_command_on_the_slice(tmp_path):
  out, calls = run(tmp_path, 'create')
  assert out.returncode == 0, out.stderr
  assert calls == ['gcloud compute tpus queued-resources create lm-run --node-id '
                   'lm-run --zone us-east5-a --accelerator-type v5p-128 '
                   '--runtime-version v2-alpha-tpuv5']
  _, calls = run(tmp_path, 'install')
  assert calls[0].startswith('gcloud compute tpus tpu-vm ssh lm-run --zone '
                             'us-east5-a --worker=all --command')
  assert "pip install -q -e '.[tpu]'" in calls[0]
  assert 'python3.11 -m venv' in calls[0]
  _, calls = run(tmp_path, 'mount', BUCKET='gs://my-bucket')
  assert '--worker=all' in calls[0]
  assert 'gcsfuse --implicit-dirs my-bucket /mnt/data' in calls[0]
  _, calls = run(tmp_path, 'prepare', '--config', 'lm_1_3b',
                 '--config.data.data_dir=/mnt/data/tfds')
  assert '--worker=0' in calls[0]
  assert ('python scripts/prepare_data.py --config lm_1_3b '
          '--config.data.data_dir=/mnt/data/tfds') in calls[0]
  _, calls = run(tmp_path, 'train', '--config', 'lm_1_3b', '--workdir',
                 'gs://b/runs/my run')
  assert '--worker=all' in calls[0]
  assert ('train_until_done.sh --config lm_1_3b --workdir gs://b/runs/my\\ '
          'run > ~/train.log') in calls[0]
  _, calls = run(tmp_path, 'stop')
  assert "pkill -TERM -f 'train_until_done.sh|train.py'" in calls[0]
  _, calls = run(tmp_path, 'delete')
  assert calls == ['gcloud compute tpus queued-resources delete lm-run --zone '
                   'us-east5-a --force --quiet']


def test_an_unknown_step_or_missing_setting_is_one_line(tmp_path):
  out, calls = run(tmp_path, 'launch')
  assert out.returncode == 2 and not calls
  assert out.stderr.strip().count('\n') == 0
  out, calls = run(tmp_path, 'create', TYPE='')
  assert out.returncode != 0 and not calls and 'set TYPE' in out.stderr


def test_the_slurm_job_runs_the_loop_on_every_node_and_requeues_after_75(
    tmp_path):
  script = os.path.join(LAUNCH, 'slurm_train.sbatch')
  flags = ('--config', 'lm_1_3b', '--workdir', '/shared/runs/x')
  out, calls = run(tmp_path, *flags, script=script, status=75,
                   SLURM_JOB_ID='17', SLURM_SUBMIT_DIR=repo.ROOT)
  assert out.returncode == 75
  assert calls == ['srun --kill-on-bad-exit=1 bash scripts/launch/'
                   'train_until_done.sh --config lm_1_3b --workdir '
                   '/shared/runs/x', 'scontrol requeue 17']
  out, calls = run(tmp_path, *flags, script=script, status=0,
                   SLURM_JOB_ID='17', SLURM_SUBMIT_DIR=repo.ROOT)
  assert out.returncode == 0 and len(calls) == 1
  with open(script) as f:
    assert '#SBATCH --ntasks-per-node=1' in f.read()


def test_gpu_hosts_start_one_process_per_host_the_first_coordinating(
    tmp_path):
  script = os.path.join(LAUNCH, 'gpu_hosts.sh')
  out, calls = run(tmp_path, '--config', 'lm_1_3b', script=script,
                   HOSTS='gpu-0 gpu-1', REPO_DIR='/srv/jt')
  assert out.returncode == 0, out.stderr
  assert [c.split()[1] for c in calls] == ['gpu-0', 'gpu-1']
  for i, call in enumerate(calls):
    call = ' '.join(call.split())
    assert 'cd /srv/jt' in call
    assert ('train_until_done.sh --config lm_1_3b --coordinator_address='
            f'gpu-0:4321 --num_processes=2 --process_id={i}') in call
  _, calls = run(tmp_path, script=script, HOSTS='gpu-0 gpu-1', STOP='1')
  assert len(calls) == 2 and all('pkill -TERM' in c for c in calls)
