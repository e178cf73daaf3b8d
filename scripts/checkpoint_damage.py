"""Ways a committed checkpoint gets damaged after its save (a disk error, a
partial copy, an object store that lost a part), for the soak test and the
tests: each takes a step folder, checkpoints/STEP, and damages it in place.
"""

from __future__ import annotations

import os
import random
import shutil


def _files(step_dir: str) -> list[str]:
  return sorted(os.path.join(d, f) for d, _, fs in os.walk(step_dir)
                for f in fs)


def truncate(step_dir: str) -> None:
  """Every file cut to half its size."""
  for f in _files(step_dir):
    os.truncate(f, os.path.getsize(f) // 2)


def empty(step_dir: str) -> None:
  """Every file emptied."""
  for f in _files(step_dir):
    os.truncate(f, 0)


def scramble(step_dir: str) -> None:
  """Every file overwritten with random bytes of its size."""
  rng = random.Random(0)
  for f in _files(step_dir):
    with open(f, 'r+b') as out:
      out.write(rng.randbytes(os.path.getsize(f)))


def drop_a_file(step_dir: str) -> None:
  """The largest data file of the parameters removed."""
  arrays = [f for f in _files(os.path.join(step_dir, 'params'))
            if os.sep + 'd' + os.sep in f]
  os.remove(max(arrays, key=os.path.getsize))


def drop_a_folder(step_dir: str) -> None:
  """The parameters' folder removed."""
  shutil.rmtree(os.path.join(step_dir, 'params'))


DAMAGES = {f.__name__: f for f in (truncate, empty, scramble, drop_a_file,
                                   drop_a_folder)}
