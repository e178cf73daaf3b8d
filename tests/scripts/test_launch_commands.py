"""The launch scripts issue the commands docs/launch.md describes: a stand-in
gcloud on PATH records them, and every gcloud command
tpu_vm.sh issues, for one slice and for several, is parsed by the real
gcloud where it is installed (test_launch_remote.py runs what the commands
run on the workers; the runs these start are tested in
test_launch_scripts.py and tests/runtime; the SLURM job on a real SLURM in
test_slurm_jobs.py)."""

import concurrent.futures
import json
import os
import re
import shutil
import subprocess

import pytest
import repo
from tpu_vm_stand_in import stand_in_tools

LAUNCH = os.path.join(repo.SCRIPTS, 'launch')
SCRIPT = os.path.join(LAUNCH, 'tpu_vm.sh')
SLICE = {'TPU_NAME': 'lm-run', 'ZONE': 'us-east5-a', 'TYPE': 'v5p-128'}
FLAGS = ('--config', 'lm_1_3b', '--workdir', 'gs://b/runs/my run')


def tpu(tmp_path, *args, **env):
  """tpu_vm.sh ARGS with the stand-in gcloud of tpu_vm_stand_in.py (it
  runs nothing: no $WORKER_HOME); its output and the gcloud calls, each
  an argv list without the leading 'gcloud'."""
  bin_dir = stand_in_tools(str(tmp_path / 'bin'))
  log = tmp_path / 'gcloud.jsonl'
  full_env = {k: v for k, v in os.environ.items()
              if not k.startswith(('CLOUDSDK_', 'NODE_COUNT', 'RUNTIME'))}
  full_env.update(PATH=f'{bin_dir}:{os.environ["PATH"]}', CALLS=str(log),
                  HOME=str(tmp_path),
                  LOGS_DIR=str(tmp_path / 'logs'), POLL_S='0', **SLICE)
  full_env.update(env)
  out = subprocess.run(['bash', SCRIPT, *args], env=full_env,
                       capture_output=True, text=True, timeout=60)
  calls = ([json.loads(line) for line in log.read_text().splitlines()]
           if log.exists() else [])
  log.unlink(missing_ok=True)
  return out, calls


def command_of(call):
  """The --command an ssh call runs on the workers."""
  return call[call.index('--command') + 1]


def test_one_slice_each_step_is_gcloud_on_its_workers(tmp_path):
  out, calls = tpu(tmp_path, 'create', CREATE_FLAGS='--spot')
  assert out.returncode == 0, out.stderr
  assert calls == [['compute', 'tpus', 'queued-resources', 'create', 'lm-run',
                    '--node-id', 'lm-run', '--zone', 'us-east5-a',
                    '--accelerator-type', 'v5p-128', '--runtime-version',
                    'v2-alpha-tpuv5', '--spot']]
  out, calls = tpu(tmp_path, 'install')
  assert out.returncode == 0, out.stderr
  scp, ssh = calls
  assert scp[:4] == ['compute', 'tpus', 'tpu-vm', 'scp']
  assert scp[4].endswith('/jax_transformer.tgz')
  assert scp[5:] == ['lm-run:jax_transformer.tgz', '--zone', 'us-east5-a',
                     '--worker=all']
  assert ssh[:8] == ['compute', 'tpus', 'tpu-vm', 'ssh', 'lm-run', '--zone',
                     'us-east5-a', '--worker=all']
  assert command_of(ssh).startswith("bash -c '")
  assert command_of(ssh).endswith(" tpu_vm 'python3.11'")
  assert "-o DPkg::Lock::Timeout=600" in command_of(ssh)
  _, (ssh,) = tpu(tmp_path, 'mount', BUCKET='gs://my-bucket')
  assert '--worker=all' in ssh
  assert '--rename-dir-limit="$2" "$1" /mnt/data' in command_of(ssh)
  assert command_of(ssh).endswith(" tpu_vm 'my-bucket' '200000'")
  _, (ssh,) = tpu(tmp_path, 'prepare', '--config', 'lm_1_3b',
                  '--config.data.data_dir=/mnt/data/tfds')
  assert '--worker=0' in ssh
  assert 'scripts/prepare_data.py "$@"' in command_of(ssh)
  assert command_of(ssh).endswith(
      " tpu_vm '--config' 'lm_1_3b' '--config.data.data_dir=/mnt/data/tfds'")
  _, (ssh,) = tpu(tmp_path, 'train', *FLAGS)
  assert '--worker=all' in ssh
  assert command_of(ssh).endswith(
      " tpu_vm 'gs://b/runs/my run' '--config' 'lm_1_3b' '--workdir' "
      "'gs://b/runs/my run'")
  _, calls = tpu(tmp_path, 'status')
  assert [c[2:4] for c in calls] == [['queued-resources', 'describe'],
                                     ['tpu-vm', 'ssh'], ['tpu-vm', 'ssh']]
  assert '--worker=all' in calls[1] and '--worker=0' in calls[2]
  _, (ssh,) = tpu(tmp_path, 'stop')
  assert '--worker=all' in ssh and 'kill -TERM' in command_of(ssh)
  _, calls = tpu(tmp_path, 'delete')
  assert calls == [['compute', 'tpus', 'queued-resources', 'delete', 'lm-run',
                    '--zone', 'us-east5-a', '--force', '--quiet']]


def test_logs_come_from_every_worker_one_copy_each(tmp_path):
  out, calls = tpu(tmp_path, 'logs')
  assert out.returncode == 0, out.stderr
  assert calls[0] == ['compute', 'tpus', 'tpu-vm', 'describe', 'lm-run',
                      '--zone', 'us-east5-a',
                      '--format=value(networkEndpoints.len())']
  logs = str(tmp_path / 'logs')
  assert sorted(calls[1:]) == [
      ['compute', 'tpus', 'tpu-vm', 'scp', 'lm-run:train.log',
       f'{logs}/worker-{w}.log', '--zone', 'us-east5-a', f'--worker={w}']
      for w in (0, 1)]
  _, calls = tpu(tmp_path, 'logs', NODE_COUNT='2', WORKERS='3')
  assert sorted(c[4:6] for c in calls) == sorted(
      [f'lm-run-{n}:train.log', f'{logs}/slice-{n}-worker-{w}.log']
      for n in (0, 1) for w in (0, 1, 2))


def test_several_slices_are_one_queued_resource_reached_with_node_all(
    tmp_path):
  env = {'NODE_COUNT': '2'}
  out, calls = tpu(tmp_path, 'create', **env)
  assert out.returncode == 0, out.stderr
  assert calls == [['compute', 'tpus', 'queued-resources', 'create', 'lm-run',
                    '--node-count', '2', '--node-prefix', 'lm-run', '--zone',
                    'us-east5-a', '--accelerator-type', 'v5p-128',
                    '--runtime-version', 'v2-alpha-tpuv5']]
  _, (scp, ssh) = tpu(tmp_path, 'install', **env)
  assert scp[:4] == ['compute', 'tpus', 'queued-resources', 'scp']
  assert scp[5:] == ['lm-run:jax_transformer.tgz', '--zone', 'us-east5-a',
                     '--node=all', '--worker=all']
  every = ['compute', 'tpus', 'queued-resources', 'ssh', 'lm-run', '--zone',
           'us-east5-a', '--node=all', '--worker=all', '--command']
  first = every[:7] + ['--node=0', '--worker=0', '--command']
  assert ssh[:-1] == every
  for step, where in (('mount', every), ('prepare', first),
                      ('train', every), ('stop', every)):
    _, (ssh,) = tpu(tmp_path, step, *FLAGS, BUCKET='gs://my-bucket', **env)
    assert ssh[:-1] == where, step
  _, (_, ssh_all, ssh_first) = tpu(tmp_path, 'status', **env)
  assert ssh_all[:-1] == every and ssh_first[:-1] == first


@pytest.mark.parametrize('kind, runtime', [
    ('v4-32', 'tpu-ubuntu2204-base'), ('v5litepod-16', 'v2-alpha-tpuv5-lite'),
    ('v5p-128', 'v2-alpha-tpuv5'), ('v6e-256', 'v2-alpha-tpuv6e')])
def test_the_runtime_follows_the_tpu_generation(tmp_path, kind, runtime):
  out, (call,) = tpu(tmp_path, 'create', TYPE=kind)
  assert out.returncode == 0, out.stderr
  assert call[call.index('--runtime-version') + 1] == runtime
  _, (call,) = tpu(tmp_path, 'create', TYPE=kind, RUNTIME='my-runtime')
  assert call[call.index('--runtime-version') + 1] == 'my-runtime'


def test_create_node_count_is_remembered_by_the_later_commands(tmp_path):
  """The guide's line: `create --node-count 2`, then every command
  without NODE_COUNT reaches both slices."""
  out, (call,) = tpu(tmp_path, 'create', '--node-count', '2', '--spot')
  assert out.returncode == 0, out.stderr
  assert call[4:9] == ['lm-run', '--node-count', '2', '--node-prefix',
                       'lm-run'] and call[-1] == '--spot'
  _, (ssh,) = tpu(tmp_path, 'stop')
  assert ssh[:9] == ['compute', 'tpus', 'queued-resources', 'ssh', 'lm-run',
                     '--zone', 'us-east5-a', '--node=all', '--worker=all']
  tpu(tmp_path, 'create', '--node-count', '1')
  _, (ssh,) = tpu(tmp_path, 'stop')
  assert ssh[:5] == ['compute', 'tpus', 'tpu-vm', 'ssh', 'lm-run']


@pytest.mark.parametrize('args, env, says', [
    (('launch',), {}, "unknown command 'launch'"),
    (('create',), {'TYPE': ''}, 'set TYPE'),
    (('create',), {'TYPE': 'v9-8'}, 'set RUNTIME'),
    (('create', '--node-id', 'x'), {}, '--node-id is set by tpu_vm.sh'),
    (('create', '--node-count', 'two'), {}, '--node-count must be'),
    (('stop',), {'NODE_COUNT': 'two'}, 'NODE_COUNT must be'),
    (('babysit',), {}, "babysit takes train's flags"),
    (('logs',), {'WORKERS_ANSWER': ''}, 'set WORKERS'),
])
def test_a_refusal_is_one_line_before_any_slice_command(tmp_path, args, env,
                                                         says):
  out, calls = tpu(tmp_path, *args, **env)
  assert out.returncode != 0 and says in out.stderr
  assert out.stderr.strip().count('\n') == 0
  assert all('describe' in c for c in calls)


def babysit(tmp_path, states, probes, **env):
  (tmp_path / 'states').write_text(''.join(s + '\n' for s in states))
  (tmp_path / 'probes').write_text(''.join(p + '\n' for p in probes))
  out, calls = tpu(tmp_path, 'babysit', *FLAGS,
                   QR_STATES=str(tmp_path / 'states'),
                   PROBES=str(tmp_path / 'probes'), **env)
  steps = []
  for call in calls:
    what = call[4]
    if call[3] == 'ssh':
      script = command_of(call)
      what = ('probe' if 'run=idle' in script else
              'mount' if 'gcsfuse' in script else
              'install' if 'pip install' in script else 'train')
    elif call[3] == 'scp':
      what = call[5]
    steps.append(' '.join(call[2:4] + [what]))
  return out, steps, calls


def test_babysit_ends_with_the_run(tmp_path):
  out, steps, _ = babysit(tmp_path, ['ACTIVE', 'ACTIVE'],
                       ['run=running', 'run=exit=0'])
  assert out.returncode == 0, out.stderr
  assert steps == ['queued-resources describe lm-run', 'tpu-vm ssh probe'] * 2
  out, _, _ = babysit(tmp_path, ['ACTIVE'], ['run=exit=2'])
  assert out.returncode == 2 and 'ended with status 2' in out.stderr


def test_babysit_recreates_a_preempted_slice_and_starts_the_run_again(
    tmp_path):
  out, steps, _ = babysit(
      tmp_path, ['ACTIVE', 'SUSPENDED', 'WAITING_FOR_RESOURCES', 'ERROR',
                 'ACTIVE', 'ACTIVE'],
      ['run=running', 'run=idle', 'run=exit=75'],
      CREATE_FLAGS='--spot', BUCKET='gs://my-bucket', NODE_COUNT='2')
  assert out.returncode == 75, out.stderr
  look = 'queued-resources describe lm-run'
  assert steps == [
      look, 'queued-resources ssh probe',
      look, 'queued-resources delete lm-run', 'queued-resources create lm-run',
      look, look,
      look, 'queued-resources ssh probe',
      'queued-resources scp lm-run:jax_transformer.tgz',
      'queued-resources ssh install',
      'queued-resources ssh mount', 'queued-resources ssh train',
      look, 'queued-resources ssh probe']
  assert 'recreating it (1 of 3)' in out.stderr
  assert 'SUSPENDED' in out.stderr and 'WAITING_FOR_RESOURCES' in out.stderr


def test_babysit_gives_up_after_max_recreates(tmp_path):
  out, steps, _ = babysit(tmp_path, ['FAILED', 'ACTIVE', 'SUSPENDED'],
                       ['run=running'], MAX_RECREATES='1')
  assert out.returncode == 1
  assert 'after 1 recreations; giving up' in out.stderr
  assert steps.count('queued-resources create lm-run') == 1


# What the real gcloud says when it parsed a command and stopped only for
# the missing project or account; and what it says when it did not parse.
GCLOUD_FINE = ('Failed to find attribute [project]',
               'You do not currently have an active account selected',
               'The required property [project] is not currently set')
GCLOUD_REFUSED = re.compile(r'\) argument |unrecognized arguments|'
                            r'Invalid choice|must be specified|'
                            r'expected one argument')


def shape(call):
  """A gcloud command with what its parser does not look at made the same:
  --command's script, the local tarball, a slice's and a worker's number."""
  words = []
  for i, arg in enumerate(call):
    if i and call[i - 1] == '--command':
      arg = '...'
    arg = re.sub(r'^/.*/jax_transformer\.tgz$', 'TARBALL', arg)
    words.append(re.sub(r'(lm-run-|slice-|worker-|--worker=)\d', r'\1N', arg))
  return json.dumps(words)


def every_gcloud_command(tmp_path):
  """Every gcloud command tpu_vm.sh issues, one slice and two, each shape
  once."""
  runs = [('create',), ('install',), ('mount',), ('prepare', *FLAGS),
          ('train', *FLAGS), ('status',), ('logs',), ('stop',), ('delete',)]
  calls = []
  for env in ({}, {'NODE_COUNT': '2'}):
    for args in runs:
      out, issued = tpu(tmp_path, *args, BUCKET='gs://b',
                        CREATE_FLAGS='--spot', **env)
      assert out.returncode == 0, out.stderr
      calls += issued
    calls += babysit(tmp_path, ['SUSPENDED', 'ACTIVE'], ['run=exit=0'],
                     **env)[2]
  return list({shape(call): call for call in calls}.values())


def real_gcloud(tmp_path, commands):
  """Each command through the real gcloud with an empty configuration,
  four at once; each one's completed process."""
  config = tmp_path / 'gcloud_config'
  config.mkdir(exist_ok=True)
  env = {k: v for k, v in os.environ.items() if not k.startswith('CLOUDSDK_')}
  env.update(CLOUDSDK_CONFIG=str(config), CLOUDSDK_CORE_DISABLE_PROMPTS='1')
  (tmp_path / 'logs').mkdir(exist_ok=True)

  def parse(call):
    return subprocess.run(['gcloud', *call], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    return list(pool.map(parse, commands))


def assert_parsed(commands, results):
  """gcloud got as far as wanting a project or credentials."""
  for call, out in zip(commands, results):
    said = f'gcloud {" ".join(call)}\n{out.stderr}'
    assert out.returncode != 0, said
    assert not GCLOUD_REFUSED.search(out.stderr), said
    assert any(s in out.stderr for s in GCLOUD_FINE), said


needs_gcloud = pytest.mark.skipif(shutil.which('gcloud') is None,
                                  reason='no gcloud here')


@needs_gcloud
def test_the_real_gcloud_takes_one_and_several_slices(tmp_path):
  """The guide's multi-slice create, which gcloud once refused."""
  commands = [tpu(tmp_path, 'create', *args)[1][0]
              for args in ((), ('--node-count', '2'))]
  assert_parsed(commands, real_gcloud(tmp_path, commands))


@pytest.mark.slow
@needs_gcloud
def test_the_real_gcloud_parses_every_command(tmp_path):
  commands = every_gcloud_command(tmp_path)
  assert len(commands) >= 15
  assert_parsed(commands, real_gcloud(tmp_path, commands))
