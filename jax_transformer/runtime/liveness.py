"""Heartbeats between the processes of a multi-process run, and a clean stop
when one of them is lost.

Collectives (the train step's all-reduce, the allgathers of a checkpoint
save) have no timeout. When a process dies, the others block in their next
collective, or in JAX's shutdown barrier on the way out, until JAX's
coordination service notices the silence and aborts them with a native crash
dump. Here each process runs a watchdog instead: it publishes a counter in the
coordination service's key-value store every few seconds and reads everyone
else's. A process whose counter has not moved for the heartbeat timeout is
lost, and so is process 0 when the store (which process 0 hosts) has not
answered for that long. The watchdog then prints one line naming the lost
process and the newest checkpoint, and ends this process with
EXIT_LOST_PROCESS.

JAX's own heartbeat timeout is set longer (see distributed.py), so that this
message comes first.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from orbax.checkpoint import utils

from jax_transformer.runtime.exits import EXIT_LOST_PROCESS

# Key-value store entries: one per process, its heartbeat count or DONE.
_PREFIX = 'jax_transformer/heartbeat/'
DONE = 'done'  # left the run normally: silence from now on is expected


class Monitor:
  """What this process knows of the others' heartbeats, and who is lost.

  Bookkeeping only, over times passed in (so that tests need no processes
  and no waiting). A peer's silence is measured up to the store's last
  answer, not up to now, so that a watchdog which itself could not run for
  a while does not blame the others for it.
  """

  def __init__(self, process_id: int, num_processes: int, timeout: float,
               now: float):
    self.process_id = process_id
    self.num_processes = num_processes
    self.timeout = timeout
    # Each peer's last heartbeat value and when it was first seen.
    self._beats = {p: (None, now) for p in range(num_processes)
                   if p != process_id}
    self._answered = now       # the store's last answer
    self._asking_since = None  # the first request not answered since

  def asking(self, now: float) -> None:
    """A request to the store is about to go out."""
    if self._asking_since is None:
      self._asking_since = now

  def answered(self, beats: dict[int, str], now: float) -> None:
    """The store answered with every process's heartbeat value."""
    self._answered, self._asking_since = now, None
    for process, value in beats.items():
      seen = self._beats.get(process)
      if seen is not None and value != seen[0]:
        self._beats[process] = (value, now)

  def lost(self, now: float) -> str | None:
    """Which process is lost and why, in words, or None."""
    if (self._asking_since is not None
        and now - self._asking_since > self.timeout):
      silent = now - self._asking_since
      if self.process_id == 0:
        return (f'The coordination service in this process (0 of '
                f'{self.num_processes}) has not answered for {silent:.0f} s')
      return (f'Lost process 0 of {self.num_processes}, which hosts the '
              f'coordinator (no answer for {silent:.0f} s)')
    for process, (value, since) in sorted(self._beats.items()):
      silent = self._answered - since
      if value != DONE and silent > self.timeout:
        return (f'Lost process {process} of {self.num_processes} (no '
                f'heartbeat for {silent:.0f} s)')
    return None


def newest_checkpoint(directory: str) -> int | None:
  """The highest step among directory's complete checkpoints, or None.

  Orbax's own reading (local or object storage): a checkpoint still being
  written, as one that a lost process left behind, does not count.
  """
  return max(utils.checkpoint_steps(directory), default=None)


def resume_hint(checkpoint_dir: str, wait: float = 10) -> str:
  """What a restart resumes from, in words, after looking at most wait
  seconds: a listing that hangs (object storage out of reach, perhaps why
  a process was lost) must not keep this one from stopping."""
  found = []

  def look():
    try:
      found.append(newest_checkpoint(checkpoint_dir))
    except Exception:  # pylint: disable=broad-except
      pass  # said below as not known
  lister = threading.Thread(target=look, daemon=True)
  lister.start()
  lister.join(timeout=wait)
  if not found:
    return ('restart all processes to resume from the newest checkpoint in '
            f'{checkpoint_dir}')
  if found[0] is None:
    return 'no checkpoint was saved yet'
  return f'restart all processes to resume from checkpoint step {found[0]}'


def exit_now(message: str, status: int = EXIT_LOST_PROCESS) -> None:
  """Prints message as this process's last line and ends it at once.

  os._exit, because the main thread may be blocked in a collective that
  will never return, and a normal exit would wait in JAX's shutdown barrier
  for the lost process.
  """
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):  # closed or broken: the line still goes
      pass
  # On a line of its own, even after a progress bar's carriage return.
  os.write(2, f'\n{message}\n'.encode())
  os._exit(status)  # pylint: disable=protected-access


class Watchdog:
  """Two daemon threads: one publishes this process's heartbeat and reads
  everyone's; the other judges, so that a request the store never answers
  (a frozen coordinator) cannot stop the judging.

  client: JAX's distributed runtime client (key_value_set,
  key_value_dir_get). On a loss, calls exit_fn with one line that names the
  lost process and the newest checkpoint in checkpoint_dir.
  """

  def __init__(self, client: Any, process_id: int, num_processes: int,
               timeout: float, checkpoint_dir: str,
               interval: float | None = None,
               exit_fn: Callable[[str], None] = exit_now,
               clock: Callable[[], float] = time.monotonic):
    self._client = client
    self._key = f'{_PREFIX}{process_id}'
    self._checkpoint_dir = checkpoint_dir
    # Several beats per timeout: one late beat is not a loss.
    self.interval = interval or timeout / 6
    self._exit_fn = exit_fn
    self._clock = clock
    self._monitor = Monitor(process_id, num_processes, timeout, clock())
    self._lock = threading.Lock()
    self._stopped = threading.Event()
    self._publisher = threading.Thread(target=self._publish, daemon=True,
                                       name='heartbeat')
    self._judge = threading.Thread(target=self._check, daemon=True,
                                   name='heartbeat-watch')
    self._publisher.start()
    self._judge.start()

  def stop(self) -> None:
    """Leaves the run normally: the last heartbeat published is DONE, so
    the others do not count this process lost while it exits."""
    self._stopped.set()
    self._publisher.join(timeout=max(self.interval, 1.0) * 2)

  def _publish(self) -> None:
    count = 0
    while True:
      stopping = self._stopped.is_set()
      count += 1
      with self._lock:
        self._monitor.asking(self._clock())
      try:
        self._client.key_value_set(self._key, DONE if stopping else str(count),
                                   allow_overwrite=True)
        entries = self._client.key_value_dir_get(_PREFIX)
      except Exception:  # pylint: disable=broad-except
        # The coordinator's silence is judged by time, in _check.
        pass
      else:
        beats = {int(key.rsplit('/', 1)[1]): value for key, value in entries}
        with self._lock:
          self._monitor.answered(beats, self._clock())
      if stopping:
        return
      self._stopped.wait(self.interval)

  def _check(self) -> None:
    while not self._stopped.wait(self.interval):
      with self._lock:
        verdict = self._monitor.lost(self._clock())
      if verdict and not self._stopped.is_set():
        self._exit_fn(self._message(verdict))
        return

  def _message(self, verdict: str) -> str:
    return (f'{verdict}; stopping process {self._monitor.process_id} too '
            f'(exit status {EXIT_LOST_PROCESS}): '
            f'{resume_hint(self._checkpoint_dir)}.')
