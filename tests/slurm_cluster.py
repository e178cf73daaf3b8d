"""A real one-node SLURM on this machine, for the tests of
scripts/launch/slurm_train.sbatch (tests/scripts/test_slurm_jobs.py).

Debian's slurm-wlm and munge (.ci/run installs them), started as root in a
folder of their own: a munged on a private socket and key, a slurmctld and
a slurmd on localhost with ``ProctrackType=proctrack/linuxproc`` and
``TaskPlugin=task/none`` (no cgroups in a container), ``JobRequeue=1``.
Clients find it through ``SLURM_CONF``, which ``Slurm.env`` carries.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import time

DAEMONS = ('munged', 'slurmctld', 'slurmd', 'sbatch', 'scontrol')

CONF = """\
ClusterName=tests
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
JobRequeue=1
FirstJobId={first_job}
ReturnToService=2
KillWait=60
MinJobAge=600
SlurmUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> str | None:
  """Why SLURM cannot run here, or None."""
  absent = [d for d in DAEMONS if not shutil.which(d)]
  if absent:
    return (f'{", ".join(absent)} not installed (apt-get install slurm-wlm '
            'munge)')
  if os.geteuid() != 0:
    return 'the SLURM daemons are started as root'
  return None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _first_job_id() -> int:
  """A first job id whose coordinator port is free: JAX's SLURM detection
  puts the coordinator at SLURM_JOB_ID % 4096 + 61440, and job 1 of every
  test cluster would take the same port."""
  for _ in range(100):
    port = random.randrange(61440, 65536 - 64)
    with socket.socket() as s:
      try:
        s.bind(('127.0.0.1', port))
      except OSError:
        continue
    return 4096 + port - 61440
  return 1


class Slurm:
  """The daemons of one cluster in ``root``; ``stop()`` ends them."""

  def __init__(self, root: str):
    self.root = root
    self.host = socket.gethostname().split('.')[0]
    for sub in ('state', 'spool'):
      os.makedirs(os.path.join(root, sub), exist_ok=True)
    self.conf = os.path.join(root, 'slurm.conf')
    with open(self.conf, 'w') as f:
      f.write(CONF.format(host=self.host, root=root, cpus=os.cpu_count(),
                          ctld_port=_free_port(), d_port=_free_port(),
                          first_job=_first_job_id()))
    self.env = dict(os.environ, SLURM_CONF=self.conf)
    key = os.path.join(root, 'munge.key')
    with open(key, 'wb') as f:
      f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    self._run('munged', '--force', f'--socket={root}/munge.sock',
              f'--key-file={key}', f'--pid-file={root}/munge.pid',
              f'--seed-file={root}/munge.seed', f'--log-file={root}/munge.log')
    self._run('slurmctld', '-f', self.conf)
    self._run('slurmd', '-f', self.conf)
    self._wait_for_the_node()

  def _run(self, *cmd: str) -> str:
    out = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                         timeout=60, check=False)
    if out.returncode:
      raise RuntimeError(f'{" ".join(cmd)}: {out.stderr.strip()}')
    return out.stdout

  def _wait_for_the_node(self, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
      try:
        if 'idle' in self._run('sinfo', '-h', '-o', '%t'):
          return
      except RuntimeError:
        pass
      time.sleep(0.5)
    raise RuntimeError(f'SLURM did not start in {timeout} s; see the logs '
                       f'in {self.root}')

  def sbatch(self, *args: str, env: dict | None = None, cwd: str) -> str:
    """Submits; returns the job id."""
    out = subprocess.run(['sbatch', '--parsable', *args], cwd=cwd,
                         env={**self.env, **(env or {})}, capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout.strip().split(';')[0]

  def job(self, job: str) -> dict[str, str]:
    """`scontrol show job`'s fields (JobState, ExitCode, Restarts, ...)."""
    text = self._run('scontrol', 'show', 'job', job)
    return dict(re.findall(r'(\w+)=(\S*)', text))

  def wait_for(self, job: str, *states: str, timeout: float = 300,
               hurry: bool = True) -> dict[str, str]:
    """Waits until the job is in one of ``states``. A requeued job waits
    for its BeginTime (two minutes); ``hurry`` starts it at once."""
    deadline = time.time() + timeout
    while time.time() < deadline:
      fields = self.job(job)
      if fields['JobState'] in states:
        return fields
      if hurry:
        self.hurry(job, fields)
      time.sleep(0.5)
    raise TimeoutError(f'job {job} not {"/".join(states)} after {timeout} s: '
                       f'{self.job(job)}')

  def hurry(self, job: str, fields: dict[str, str] | None = None) -> None:
    """Starts a requeued job now rather than after its BeginTime, once
    its last start has been cleaned up (10 s after the requeue: started at
    once, slurmd may still be ending the old batch step and refuses the
    new one, "Job N already killed, do not launch batch job")."""
    fields = fields or self.job(job)
    requeued = time.mktime(time.strptime(fields['SubmitTime'],
                                         '%Y-%m-%dT%H:%M:%S'))
    if fields.get('Reason') == 'BeginTime' and time.time() - requeued > 10:
      subprocess.run(['scontrol', 'update', f'JobId={job}', 'StartTime=now'],
                     env=self.env, check=False, capture_output=True)

  def command(self, *cmd: str) -> str:
    """A client command (scancel, scontrol ...) against this cluster."""
    return self._run(*cmd)

  def stop(self) -> None:
    subprocess.run(['scancel', '--full', '--signal=KILL', '--user=root'],
                   env=self.env, capture_output=True, check=False)
    for pid_file in ('slurmd.pid', 'slurmctld.pid', 'munge.pid'):
      path = os.path.join(self.root, pid_file)
      try:
        with open(path) as f:
          os.kill(int(f.read().strip()), 15)
      except (OSError, ValueError):
        pass
