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
