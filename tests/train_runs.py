"""train.py run as users run it, in subprocesses, for tests in any folder."""

import os
import socket
import subprocess
import sys

import repo
import xla_flags


def train_env(devices=8, **more):
  """The environment train() runs train.py in; more: other variables."""
  return dict(os.environ, JAX_PLATFORMS='cpu',
              XLA_FLAGS=xla_flags.cpu(devices), **more)


def train_command(workdir, data_dir, *flags, config='lm_shakespeare'):
  """The command line of train() (a list)."""
  return [sys.executable, os.path.join(repo.ROOT, 'train.py'),
          '--config', os.path.join(repo.ROOT, f'configs/{config}.py:tiny'),
          '--workdir', str(workdir), f'--config.data.data_dir={data_dir}',
          '--config.sample.enabled=False', *flags]


def train(workdir, data_dir, *flags, devices=8, wait=True,
          config='lm_shakespeare', env=None, **popen):
  """train.py on config's tiny preset; env: more environment variables."""
  proc = subprocess.Popen(train_command(workdir, data_dir, *flags,
                                        config=config),
                          env=train_env(devices, **(env or {})),
                          cwd=repo.ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, **popen)
  if not wait:
    return proc
  return finish(proc)


def finish(proc):
  """The output of a train() started with wait=False; it must succeed."""
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out[-3000:]
  return out


def together(*procs):
  """Waits for independent runs started together (wait=False); their
  outputs, in order. A tiny model's run keeps about one core busy
  (compiling, then small steps), so two at once take little longer than
  one on CI's two cores."""
  try:
    return [finish(p) for p in procs]
  finally:
    for p in procs:
      p.kill()


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]
