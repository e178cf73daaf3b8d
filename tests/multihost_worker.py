"""One process of a tiny multi-process job, for test_multihost_faults.py.

python multihost_worker.py ADDRESS PROCESS_ID HEARTBEAT_TIMEOUT CHECKPOINT_DIR

Joins two processes through distributed.initialize, starts the heartbeat
watchdog, then allgathers forever as a training loop's collectives do,
printing 'ready' after the first one.
"""

import sys

import numpy as np
from jax.experimental import multihost_utils

from jax_transformer.runtime import distributed


def main(address, process_id, heartbeat, checkpoint_dir):
  distributed.initialize(address, 2, int(process_id), distributed.Timeouts(
      init=120, heartbeat=float(heartbeat)))
  distributed.watch(checkpoint_dir)
  step = 0
  while True:
    multihost_utils.process_allgather(np.int32(step))
    if step == 0:
      print('ready', flush=True)
    step += 1


if __name__ == '__main__':
  main(*sys.argv[1:])
