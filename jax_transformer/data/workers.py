"""Grain's data worker processes: tied to the process that started them, and
stopped in bounded time whatever state they are in.

Grain 0.2.x (``IterDataset.mp_prefetch``) starts each worker from a
prefetch *thread* of the parent, and sends batches back through a
``multiprocessing.Queue``: a pipe, which holds 64 KiB, while a batch is
often a megabyte. Two consequences, both seen as a trainer that never
exited (issue 30):

* ``PR_SET_PDEATHSIG`` fires when the *thread* that started a process ends
  (prctl(2)), not the process. Grain's close ends that thread first, so a
  worker given the signal was killed halfway through writing a batch.
  ``end_with_parent`` watches the parent process instead.
* A worker that dies halfway through a message (that signal, the OOM
  killer, a signal sent to the whole process group) leaves part of it in
  the pipe, and the parent still holds the pipe's write end, so Grain's
  close, draining the queue, waits forever for the rest. ``stop`` kills the
  workers first, then makes every read of their queues end at once, and
  runs Grain's own close under a time limit.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
import threading
import time
from concurrent import futures
from typing import Any

import grain
from absl import logging

# How often a worker looks for its parent; it outlives a killed parent by
# at most about this long.
PARENT_POLL_S = 0.2
# What closing an iterator may take at most, Grain's own close included.
CLOSE_TIMEOUT_S = 20.0


def end_with_parent(worker_index: int, worker_count: int) -> None:
  """``worker_init_fn``: this worker ends when its parent process does,
  even by SIGKILL (which gives the parent no chance to stop it)."""
  del worker_index, worker_count
  parent = multiprocessing.parent_process()
  pid = parent.pid if parent is not None else os.getppid()
  if os.getppid() != pid:  # the parent is already gone
    os.kill(os.getpid(), signal.SIGKILL)
  threading.Thread(target=_watch_parent, args=(pid,), daemon=True,
                   name='data-worker-watches-parent').start()


def _watch_parent(pid: int) -> None:
  # An orphan is adopted by init (or a subreaper): its parent id changes.
  while os.getppid() == pid:
    time.sleep(PARENT_POLL_S)
  os.kill(os.getpid(), signal.SIGKILL)


def stop(iterator: grain.DatasetIterator,
         timeout_s: float = CLOSE_TIMEOUT_S) -> None:
  """Closes a Grain iterator fed by worker processes, within timeout_s.

  The workers are killed (they hold nothing worth saving: batches come
  back pickled, never in shared memory) and reaped; every read of their
  queues then ends at once (a message cut short reads as the end of the
  pipe instead of waiting for a writer that is gone); then Grain's own
  close stops its threads. Should that still not return in time (say, a
  lock held by a killed worker), it is left behind in a daemon thread,
  with a warning, rather than block the caller.
  """
  deadline = time.monotonic() + timeout_s
  iterators = _iterators(iterator, deadline)
  workers = [it for it in iterators if _is_worker_iterator(it)]
  processes = [w._prefetch_process for w in workers  # pylint: disable=protected-access
               if w._prefetch_process is not None]  # pylint: disable=protected-access
  for w in workers:
    w._prefetch_should_stop.set()  # pylint: disable=protected-access
  for p in processes:
    if p.is_alive():
      p.kill()
  for p in processes:
    p.join(max(0.0, deadline - time.monotonic()))
  for w in workers:
    _never_wait(w._buffer, writer_gone=True)  # pylint: disable=protected-access
    _never_wait(w._set_state_queue)  # pylint: disable=protected-access
  closer = threading.Thread(target=_close_all, args=(iterator, iterators),
                            daemon=True, name='close-data-workers')
  closer.start()
  closer.join(max(0.0, deadline - time.monotonic()))
  if closer.is_alive():
    logging.warning('Grain\'s close of the data workers did not return in '
                    '%.0f s; left behind in a daemon thread.', timeout_s)
  for w in workers:  # nothing left for Grain's exit handler to stop
    w._closed = True  # pylint: disable=protected-access
    w._prefetch_process = None  # pylint: disable=protected-access


def _is_worker_iterator(it: Any) -> bool:
  return (hasattr(it, '_prefetch_process') and hasattr(it, '_buffer')
          and hasattr(it, '_set_state_queue'))


def _iterators(root: grain.DatasetIterator, deadline: float) -> list:
  """Every Grain iterator reachable from root: its parents, the iterators
  an interleave holds (in use, exhausted, or made ahead in its thread
  pool, waited for until deadline)."""
  found, seen, stack = [], set(), [root]
  while stack:
    obj = stack.pop()
    if id(obj) in seen:
      continue
    seen.add(id(obj))
    if isinstance(obj, futures.Future):
      try:
        stack.append(obj.result(max(0.0, deadline - time.monotonic())))
      except Exception:  # pylint: disable=broad-except
        pass  # cancelled, failed or late: it made no iterator to stop
    elif isinstance(obj, (list, tuple, collections.deque)):
      stack.extend(obj)
    elif isinstance(obj, dict):
      stack.extend(obj.values())
    elif isinstance(obj, grain.DatasetIterator):
      found.append(obj)
      stack.extend(vars(obj).values())
  return found


def _never_wait(q, writer_gone: bool = False) -> None:
  """Every later read of q finds it empty. writer_gone: only dead workers
  wrote to q, so this process closes its copy of the write end, and a read
  blocked inside a message they cut short gets the end of the pipe."""
  q._poll = lambda timeout=0.0: False  # pylint: disable=protected-access
  q.cancel_join_thread()  # what this process put there may be dropped
  if writer_gone:
    q._writer.close()  # pylint: disable=protected-access


def _close_all(root: grain.DatasetIterator, iterators: list) -> None:
  for it in [root, *iterators]:
    try:
      it.close()
    except Exception as e:  # pylint: disable=broad-except
      # A queue read that met the end of a cut message, a worker's
      # RuntimeError: the iterator is closed all the same.
      logging.info('Closing %s: %s', it, e)
  # Grain's close shuts its thread pools down without waiting: a thread
  # still reading a record would outlive the close. Wait for them here
  # (stop bounds this thread by its deadline).
  for it in iterators:
    executor = getattr(it, '_executor', None)
    if isinstance(executor, futures.ThreadPoolExecutor):
      executor.shutdown(wait=True, cancel_futures=True)
