"""cluster.py in one process: which job JAX's own detection finds, the
accelerators a SLURM or Open MPI task takes, what initialize hands to JAX,
and the start line."""

import os
import types

import jax
import pytest
from jax._src import cloud_tpu_init
from jax._src.clusters import cloud_tpu_cluster
from tpu_vm_stand_in import MetadataServer

from jax_transformer.runtime import cluster, distributed, xla_options
from jax_transformer.runtime.cluster import Plan, local_device_ids

# What a launcher or a machine sets; none of it may leak in from the
# machine running the tests.
_LAUNCH_PREFIXES = ('SLURM_', 'OMPI_', 'PMI_', 'TPU_', 'MEGASCALE_', 'JAX_')
_LAUNCH_VARS = ('KUBERNETES_SERVICE_HOST', 'GCE_METADATA_IP',
                'CUDA_VISIBLE_DEVICES', 'HIP_VISIBLE_DEVICES',
                'ROCR_VISIBLE_DEVICES')


@pytest.fixture(autouse=True)
def bare_machine(monkeypatch):
  """No launcher's variables (JAX's import keeps TPU_SKIP_MDS_QUERY, set
  on a machine without TPU chips); initialize's state restored after."""
  for name in list(os.environ):
    if ((name.startswith(_LAUNCH_PREFIXES) or name in _LAUNCH_VARS)
        and name not in ('TPU_SKIP_MDS_QUERY', 'JAX_PLATFORMS')):
      monkeypatch.delenv(name)
  monkeypatch.setattr(distributed, '_timeouts', distributed._timeouts)
  collectives = jax.config.jax_cpu_collectives_implementation
  yield
  jax.config.update('jax_cpu_collectives_implementation', collectives)


def slurm(monkeypatch, **variables):
  """This process as a task of a SLURM step on node001..."""
  base = dict(SLURM_JOB_ID='4242', SLURM_STEP_NODELIST='node[001-002]',
              SLURM_NTASKS='2', SLURM_PROCID='1', SLURM_LOCALID='0')
  for name, value in {**base, **variables}.items():
    monkeypatch.setenv(name, str(value))


# --- the accelerators a task takes ------------------------------------------

def test_one_task_per_node_keeps_every_local_gpu():
  for layout in ({'SLURM_NTASKS_PER_NODE': '1'},
                 {'SLURM_TASKS_PER_NODE': '1(x8)'},
                 {'SLURM_STEP_TASKS_PER_NODE': '1(x8)', 'SLURM_NODEID': '5'},
                 {'SLURM_NTASKS': '8', 'SLURM_STEP_NUM_NODES': '8'}):
    env = {'SLURM_LOCALID': '0', 'SLURM_GPUS_ON_NODE': '8',
           'CUDA_VISIBLE_DEVICES': '0,1,2,3,4,5,6,7', **layout}
    assert local_device_ids(env, 'slurm') is None, layout
  assert local_device_ids({'OMPI_COMM_WORLD_LOCAL_RANK': '0',
                           'OMPI_COMM_WORLD_LOCAL_SIZE': '1'}, 'ompi') is None


def test_one_task_per_gpu_keeps_its_own():
  env = {'SLURM_LOCALID': '5', 'SLURM_NODEID': '1',
         'SLURM_STEP_TASKS_PER_NODE': '8(x2)', 'SLURM_NTASKS_PER_NODE': '8',
         'SLURM_GPUS_ON_NODE': '8', 'CUDA_VISIBLE_DEVICES': '0,1,2,3,4,5,6,7'}
  assert local_device_ids(env, 'slurm') == (5,)
  # Nothing says how many GPUs: JAX's default, the task's local rank.
  assert local_device_ids({'SLURM_LOCALID': '3', 'SLURM_NTASKS_PER_NODE': '8'},
                          'slurm') == (3,)
  assert local_device_ids({'OMPI_COMM_WORLD_LOCAL_RANK': '2',
                           'OMPI_COMM_WORLD_LOCAL_SIZE': '4'}, 'ompi') == (2,)


def test_a_task_of_several_per_node_takes_its_share():
  env = {'SLURM_LOCALID': '1', 'SLURM_TASKS_PER_NODE': '2(x4)',
         'SLURM_GPUS_ON_NODE': '8'}
  assert local_device_ids(env, 'slurm') == (4, 5, 6, 7)


def test_gpus_the_launcher_bound_per_task_are_all_the_tasks_own():
  """srun --gpus-per-task=1: each task sees one GPU, numbered 0 for it; JAX's
  default (its local rank, 5) would name a GPU it cannot see."""
  env = {'SLURM_LOCALID': '5', 'SLURM_NTASKS_PER_NODE': '8',
         'SLURM_GPUS_ON_NODE': '8', 'CUDA_VISIBLE_DEVICES': '5'}
  assert local_device_ids(env, 'slurm') is None


def test_other_launchers_are_not_narrowed():
  assert local_device_ids({'SLURM_LOCALID': '3'}, None) is None


@pytest.mark.parametrize('env,tasks', [
    ({'SLURM_STEP_TASKS_PER_NODE': '2(x3),1', 'SLURM_NODEID': '3'}, 1),
    ({'SLURM_STEP_TASKS_PER_NODE': '2(x3),1', 'SLURM_NODEID': '1'}, 2),
    # The step's layout wins over the job's.
    ({'SLURM_STEP_TASKS_PER_NODE': '1(x2)', 'SLURM_TASKS_PER_NODE': '8(x2)'},
     1),
    ({'SLURM_TASKS_PER_NODE': '4,2'}, None),  # uneven, and no node index
    ({'SLURM_NTASKS': '16', 'SLURM_NNODES': '2'}, None),
    ({}, None)])
def test_tasks_on_this_node(env, tasks):
  assert cluster.slurm_tasks_on_node(env) == tasks


# --- the job, as JAX's detection finds it ---------------------------------

def test_a_machine_without_a_launcher_is_a_single_process():
  assert cluster.detect() is None
  assert cluster.plan() is None


def test_a_slurm_step_is_joined_through_jax_detection(monkeypatch):
  slurm(monkeypatch, SLURM_NTASKS_PER_NODE=1)
  # JAX's port for job 4242: in [65535 - 4095, 65535].
  assert cluster.plan() == Plan('node001:61586', 2, 1, None, 'SlurmCluster')
  monkeypatch.setenv('JAX_COORDINATOR_PORT', '1234')  # JAX's own override
  assert cluster.plan().coordinator_address == 'node001:1234'


def test_one_slurm_task_is_a_single_process(monkeypatch):
  slurm(monkeypatch, SLURM_NTASKS=1, SLURM_PROCID=0)
  assert cluster.detect().__name__ == 'SlurmCluster'
  assert cluster.plan() is None


def test_flags_win_over_the_environment_but_keep_its_layout(monkeypatch):
  slurm(monkeypatch, SLURM_LOCALID=3, SLURM_NTASKS_PER_NODE=8)
  assert cluster.plan('10.0.0.1:99', 4, 2) == Plan('10.0.0.1:99', 4, 2, (3,),
                                                   'flags')


@pytest.fixture
def tpu_vm(monkeypatch):
  """JAX believes this is a Cloud TPU VM (see tpu_vm_stand_in.py)."""
  monkeypatch.delenv('TPU_SKIP_MDS_QUERY', raising=False)
  monkeypatch.setattr(cloud_tpu_init, 'running_in_cloud_tpu_vm', True)
  monkeypatch.setattr(cloud_tpu_cluster, 'running_in_cloud_tpu_vm', True)


def test_a_tpu_vm_worker_is_joined_through_the_metadata_server(tpu_vm,
                                                                 monkeypatch):
  with MetadataServer(worker=1, workers=2) as server:
    monkeypatch.setenv('GCE_METADATA_IP', server.address)
    job = cluster.plan(timeout_s=10)
    assert 'agent-worker-number' in server.asked
  # JAX's fixed port for TPU VMs; never narrowed to one device.
  assert job == Plan('127.0.0.1:8482', 2, 1, None, 'GceTpuCluster')


def test_a_single_host_tpu_vm_is_a_single_process(tpu_vm, monkeypatch):
  with MetadataServer(worker=0, workers=1) as server:
    monkeypatch.setenv('GCE_METADATA_IP', server.address)
    assert cluster.detect().__name__ == 'GceTpuCluster'
    assert cluster.plan() is None


def test_a_multislice_tpu_vm_counts_every_slice(tpu_vm, monkeypatch):
  with MetadataServer(worker=1, workers=2) as server:
    monkeypatch.setenv('GCE_METADATA_IP', server.address)
    monkeypatch.setenv('MEGASCALE_NUM_SLICES', '2')
    monkeypatch.setenv('MEGASCALE_SLICE_ID', '1')
    monkeypatch.setenv('MEGASCALE_COORDINATOR_ADDRESS', '127.0.0.2')
    job = cluster.plan(timeout_s=10)
  assert job == Plan('127.0.0.2:8482', 4, 3, None, 'GceTpuCluster')


# --- what initialize hands to JAX -----------------------------------------

@pytest.fixture
def jax_calls(monkeypatch):
  calls = []
  monkeypatch.setattr(jax.distributed, 'initialize',
                      lambda *a, **k: calls.append((a, k)))
  return calls


def test_initialize_joins_a_slurm_step_with_every_local_device(monkeypatch,
                                                               jax_calls):
  slurm(monkeypatch, SLURM_TASKS_PER_NODE='1(x2)', SLURM_NODEID=1,
        SLURM_GPUS_ON_NODE=8)
  distributed.initialize()
  [(args, kwargs)] = jax_calls
  assert args == ('node001:61586', 2, 1)
  assert kwargs['local_device_ids'] is None
  # JAX must not detect again: it would narrow the task to one GPU.
  assert kwargs['cluster_detection_method'] == 'deactivate'


def test_initialize_keeps_one_gpu_per_task(monkeypatch, jax_calls):
  slurm(monkeypatch, SLURM_LOCALID=1, SLURM_NTASKS_PER_NODE=2,
        SLURM_GPUS_ON_NODE=2)
  distributed.initialize()
  assert jax_calls[0][1]['local_device_ids'] == (1,)


def test_initialize_leaves_a_single_process_alone(monkeypatch, jax_calls):
  slurm(monkeypatch, SLURM_NTASKS=1, SLURM_PROCID=0)
  distributed.initialize()
  assert jax_calls == []


# --- the start line --------------------------------------------------------

def test_the_start_line_of_a_single_process():
  assert distributed.describe_job() == (
      f'Job: 1 process (this is 0), {jax.device_count()} cpu devices each '
      '(cpu), 1 slice.')


def test_the_start_line_counts_processes_devices_and_slices(monkeypatch):
  devices = [types.SimpleNamespace(process_index=p, slice_index=p // 2,
                                   platform='tpu', device_kind='TPU v5p')
             for p in range(4) for _ in range(4)]
  monkeypatch.setattr(jax, 'devices', lambda: devices)
  monkeypatch.setattr(jax, 'local_devices', lambda: devices[4:8])
  monkeypatch.setattr(jax, 'process_count', lambda: 4)
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  assert distributed.describe_job() == (
      'Job: 4 processes (this is 1), 4 tpu devices each (TPU v5p), 2 slices.'
      f' {xla_options.describe("tpu")}.')
