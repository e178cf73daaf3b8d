"""train.py started as the machines start it: two CPU processes on
127.0.0.1 that get only what a TPU VM, or SLURM, gives them, and no
--coordinator_address, --num_processes or --process_id.
"""

import os
import random
import socket
import subprocess
import sys

import pytest
import repo
import xla_flags
from tpu_vm_stand_in import MetadataServer
from train_runs import free_port, together

pytestmark = pytest.mark.slow

# A launcher's variables that must not leak in from the machine running
# the tests (this very test may run under SLURM).
_LAUNCH_PREFIXES = ('SLURM_', 'OMPI_', 'PMI_', 'TPU_', 'MEGASCALE_', 'JAX_')
_LAUNCH_VARS = ('KUBERNETES_SERVICE_HOST', 'GCE_METADATA_IP',
                'CUDA_VISIBLE_DEVICES')


def start(workdir, data_dir, *flags, devices, env, tpu_vm=False):
  """train.py on lm_shakespeare:tiny with only env's launcher variables;
  tpu_vm: through tpu_vm_stand_in.py, as on a Cloud TPU VM."""
  base = {k: v for k, v in os.environ.items()
          if not k.startswith(_LAUNCH_PREFIXES) and k not in _LAUNCH_VARS}
  base.update(JAX_PLATFORMS='cpu',
              XLA_FLAGS=xla_flags.cpu(devices))
  stand_in = [os.path.join(repo.ROOT, 'tests', 'tpu_vm_stand_in.py')]
  cmd = [sys.executable, *(stand_in if tpu_vm else []),
         os.path.join(repo.ROOT, 'train.py'),
         '--config', os.path.join(repo.ROOT, 'configs/lm_shakespeare.py:tiny'),
         '--workdir', str(workdir), f'--config.data.data_dir={data_dir}',
         '--config.sample.enabled=False', '--config.eval_every=100',
         '--init_timeout=120', *flags]
  return subprocess.Popen(cmd, env={**base, **env}, cwd=repo.ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def test_tpu_vm_workers_join_one_job_and_train(tmp_path, fake_data_dir):
  """Each worker has its own metadata server, as each TPU VM has; one CPU
  device each, and a mesh of two: a worker that did not join would have
  one device and exit 2."""
  work = tmp_path / 'w'
  port = str(free_port())  # JAX's fixed 8482 may be taken on a shared host
  with MetadataServer(0, 2) as mds0, MetadataServer(1, 2) as mds1:
    outs = together(*[
        start(work, fake_data_dir, '--config.num_steps=2',
              '--config.mesh.data=2', devices=1, tpu_vm=True,
              env={'GCE_METADATA_IP': mds.address,
                   'JAX_COORDINATOR_PORT': port})
        for mds in (mds0, mds1)])
    assert 'worker-network-endpoints' in mds0.asked
    assert 'agent-worker-number' in mds1.asked
  for i, out in enumerate(outs):
    assert (f'Job: 2 processes (this is {i}), 1 cpu device each (cpu), '
            '1 slice.') in out
  assert (work / 'checkpoints' / '2').exists()


def slurm_port():
  """A free port JAX's SLURM detection can pick: it takes
  SLURM_JOB_ID % 4096 + 61440."""
  for _ in range(100):
    port = random.randrange(61440, 65536)
    with socket.socket() as s:
      try:
        s.bind(('127.0.0.1', port))
      except OSError:
        continue
    return port
  pytest.skip('no free port in 61440..65535')


def test_slurm_tasks_one_per_node_join_train_and_resume(tmp_path,
                                                        fake_data_dir):
  """srun --nodes=2 --ntasks-per-node=1: both 'nodes' are 127.0.0.1, each
  task keeps both of its devices (a mesh of 4), and a second srun of the
  same job resumes from the first one's checkpoint."""
  work = tmp_path / 'w'
  job = 1234 * 4096 + slurm_port() - 61440

  def srun(steps):
    return together(*[
        start(work, fake_data_dir, f'--config.num_steps={steps}',
              '--config.checkpoint_every=2', '--config.mesh.data=4',
              devices=2, env={
                  'SLURM_JOB_ID': str(job), 'SLURM_NTASKS': '2',
                  'SLURM_PROCID': str(i), 'SLURM_LOCALID': '0',
                  'SLURM_NODEID': str(i), 'SLURM_STEP_NODELIST': '127.0.0.1',
                  'SLURM_STEP_NUM_NODES': '2', 'SLURM_NTASKS_PER_NODE': '1',
                  'SLURM_TASKS_PER_NODE': '1(x2)'})
        for i in range(2)])

  outs = srun(2)
  for i, out in enumerate(outs):
    assert (f'Job: 2 processes (this is {i}), 2 cpu devices each (cpu), '
            '1 slice.') in out
  assert (work / 'checkpoints' / '2').exists()
  outs = srun(3)
  assert 'Resumed from step 2' in outs[0]
  assert (work / 'checkpoints' / '3').exists()
