"""What a Cloud TPU VM gives a process, stood in for on 127.0.0.1.

MetadataServer answers as the GCE metadata server of one TPU VM worker
does (the paths and header JAX's GceTpuCluster asks with); a process finds
it through GCE_METADATA_IP=127.0.0.1:PORT, as JAX reads it.

Run as a script, it starts another script as on a TPU VM:

  python tpu_vm_stand_in.py train.py --flags...

On a machine without TPU chips, ``import jax`` sets TPU_SKIP_MDS_QUERY and
leaves JAX's TPU-VM check False; this undoes both, for tests only, then runs
the script as __main__.
"""

import http.server
import os
import runpy
import sys
import threading

_PREFIX = '/computeMetadata/v1/instance/attributes/'


class MetadataServer:
  """One worker's metadata server: worker (its agent-worker-number) of
  workers, every one at 127.0.0.1. A context manager; .address is what
  GCE_METADATA_IP takes, .asked the attributes asked for."""

  def __init__(self, worker: int, workers: int, accelerator='v4-16'):
    self.attributes = {
        'agent-worker-number': str(worker),
        # The older name:id:ip form; JAX reads both it and bare hostnames.
        'worker-network-endpoints': ','.join(
            f'w-{i}:{i}:127.0.0.1' for i in range(workers)),
        'tpu-env': f"ACCELERATOR_TYPE: '{accelerator}'\n"
                   f"WORKER_ID: '{worker}'\n",
    }
    self.asked = []
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # noqa: N802 (http.server's name)
        key = self.path[len(_PREFIX):]
        value = server.attributes.get(key)
        if (not self.path.startswith(_PREFIX) or value is None
            or self.headers.get('Metadata-Flavor') != 'Google'):
          self.send_error(404)
          return
        server.asked.append(key)
        body = value.encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/text')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

      def log_message(self, *args):
        pass

    self._httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.address = f'127.0.0.1:{self._httpd.server_address[1]}'

  def __enter__(self):
    threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
    return self

  def __exit__(self, *exc):
    self._httpd.shutdown()
    self._httpd.server_close()


def act_as_tpu_vm():
  """JAX in this process believes it runs on a Cloud TPU VM."""
  import jax  # noqa: F401  (its import sets TPU_SKIP_MDS_QUERY here)
  from jax._src import cloud_tpu_init
  from jax._src.clusters import cloud_tpu_cluster, cluster
  os.environ.pop('TPU_SKIP_MDS_QUERY', None)
  for module in (cloud_tpu_init, cloud_tpu_cluster, cluster):
    module.running_in_cloud_tpu_vm = True


if __name__ == '__main__':
  act_as_tpu_vm()
  script = sys.argv[1]
  sys.argv = sys.argv[1:]
  runpy.run_path(script, run_name='__main__')


# --- A slice's workers, reached through gcloud (or a host through ssh) ---

_GCLOUD = r'''
"""gcloud as tpu_vm.sh calls it: records each call as a JSON line in
$CALLS; answers `describe` from $QR_STATES (a line per call; ACTIVE when
none is left) and $WORKERS_ANSWER; runs an ssh --command in $WORKER_HOME
(one worker, on this machine) or answers babysit's probe from $PROBES;
copies scp's files to and from $WORKER_HOME."""
import json, os, shutil, subprocess, sys

args = sys.argv[1:]
env = os.environ
with open(env['CALLS'], 'a') as f:
  f.write(json.dumps(args) + '\n')


def pop(name, default):
  path = env.get(name)
  if not path or not os.path.exists(path):
    return default
  with open(path) as f:
    lines = f.read().splitlines()
  with open(path, 'w') as f:
    f.write(''.join(line + '\n' for line in lines[1:]))
  return lines[0] if lines else default


def on_worker(path):
  return os.path.join(env['WORKER_HOME'], path.split(':', 1)[1])


home = env.get('WORKER_HOME')
if 'describe' in args:
  if 'queued-resources' in args:
    state = pop('QR_STATES', 'ACTIVE')
    if state == 'ERROR':
      sys.exit(1)
    print(state)
  else:
    print(env.get('WORKERS_ANSWER', '2'))
elif 'ssh' in args:
  command = next(a.split('=', 1)[1] if a.startswith('--command=')
                 else args[i + 1] for i, a in enumerate(args)
                 if a.startswith('--command'))
  if 'run=idle' in command and env.get('PROBES'):
    print(pop('PROBES', 'run=running'))
  elif home:
    sys.exit(subprocess.run(['sh', '-c', command], cwd=home,
                            env={**env, 'HOME': home}).returncode)
elif 'scp' in args and home:
  paths = [a for a in args[4:] if not a.startswith('--')]
  src, dst = paths[0], paths[1]
  if ':' in dst:
    shutil.copy(src, on_worker(dst))
  else:
    shutil.copy(on_worker(src), dst)
sys.exit(int(env.get('GCLOUD_STATUS', '0')))
'''

_SSH = r'''
"""ssh HOST COMMAND: runs COMMAND here with HOME=$HOSTS_HOME/HOST (made if
missing) and a PATH without python, as a login shell would; records the
call in $CALLS; exits 255 for a host named in $DOWN_HOSTS."""
import json, os, subprocess, sys

host, command = sys.argv[1], ' '.join(sys.argv[2:])
with open(os.environ['CALLS'], 'a') as f:
  f.write(json.dumps(['ssh', host, command]) + '\n')
if host in os.environ.get('DOWN_HOSTS', '').split():
  sys.exit(255)
home = os.path.join(os.environ['HOSTS_HOME'], host)
os.makedirs(home, exist_ok=True)
env = {'HOME': home, 'PATH': os.environ['LOGIN_PATH'], 'USER': 'me'}
sys.exit(subprocess.run(['sh', '-c', command], cwd=home,
                        env=env).returncode)
'''

_SUDO = r'''#!/bin/sh
# sudo on a worker: recorded; fuser names $TPU_HOLDERS; kill runs; the
# rest (rm of /tmp/libtpu_lockfile, apt) is only recorded.
echo "sudo $*" >> "$HOME/sudo.log"
case "$1" in
  fuser) [ -n "$TPU_HOLDERS" ] && echo " $TPU_HOLDERS" && exit 0; exit 1 ;;
  kill) shift; exec kill "$@" ;;
esac
exit 0
'''


def stand_in_tools(bin_dir, python=sys.executable):
  """Writes stand-in gcloud, ssh and sudo into bin_dir (see their
  docstrings above for what each does); returns bin_dir."""
  os.makedirs(bin_dir, exist_ok=True)
  for name, text in (('gcloud', f'#!{python}\n{_GCLOUD}'),
                     ('ssh', f'#!{python}\n{_SSH}'), ('sudo', _SUDO)):
    path = os.path.join(bin_dir, name)
    with open(path, 'w') as f:
      f.write(text)
    os.chmod(path, 0o755)
  return bin_dir


# A train.py for the launch scripts: records its flags, the Python it runs
# under ($JT_PYTHON, set by a stand-in venv) and each SIGTERM in $HOME; on
# the first SIGTERM it "saves" for half a second (where a second SIGTERM
# would land) and exits 75; it finishes by itself (exit 0) when
# $HOME/finish exists.
DUMMY_TRAIN_PY = r'''
import json, os, signal, sys, time

home = os.environ['HOME']
terms = []
signal.signal(signal.SIGTERM, lambda *_: terms.append(1) or open(
    os.path.join(home, 'terms'), 'a').write('TERM\n'))
with open(os.path.join(home, 'train.argv'), 'w') as f:
  json.dump({'argv': sys.argv[1:], 'python': os.environ.get('JT_PYTHON')}, f)
while not terms and not os.path.exists(os.path.join(home, 'finish')):
  time.sleep(0.02)
if not terms:
  sys.exit(0)
time.sleep(0.5)
sys.exit(75)
'''
