"""`mpirun -np 2 python train.py ...` with the real Open MPI (openmpi-bin,
installed by .ci/run): the two ranks join one job through JAX's Open MPI
detection, with no flag of ours, and train on a mesh of 2."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import repo
import xla_flags

from jax_transformer import data

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which('mpirun') is None,
                       reason='no Open MPI here (apt-get install openmpi-bin)'),
]


def test_mpirun_ranks_join_one_job_and_train_on_a_mesh_of_2(
    tmp_path, real_data_dir):
  data.prepare('shakespeare', real_data_dir)
  work = tmp_path / 'w'
  # As root (CI), Open MPI wants both variables; a user's mpirun needs none.
  env = {k: v for k, v in os.environ.items() if not k.startswith('OMPI_')}
  env.update(OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1',
             JAX_PLATFORMS='cpu',
             XLA_FLAGS=xla_flags.cpu(1))
  out = subprocess.run(
      ['mpirun', '-np', '2', '--oversubscribe', '-x', 'JAX_PLATFORMS',
       '-x', 'XLA_FLAGS', sys.executable, 'train.py',
       '--config', 'lm_shakespeare:tiny', '--workdir', str(work),
       f'--config.data.data_dir={real_data_dir}', '--config.mesh.data=2',
       '--config.num_steps=10', '--config.eval_every=10',
       '--config.sample.enabled=False'],
      cwd=repo.ROOT, env=env, capture_output=True, text=True, timeout=600)
  said = out.stdout[-3000:] + out.stderr[-3000:]
  assert out.returncode == 0, said
  for rank in (0, 1):
    assert f'Job: 2 processes (this is {rank}), 1 cpu device each' in (
        out.stdout + out.stderr), said
  assert ("mesh {'data': 2, 'fsdp': 1, 'sequence': 1, 'tensor': 1}"
          in out.stdout), said
  rows = [json.loads(line) for line in
          (work / 'metrics.jsonl').read_text().splitlines()]
  assert rows[-1]['step'] == 10
