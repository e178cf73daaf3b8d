"""When this program started, on the ``time.time()`` clock.

Imported first by the package (``jax_transformer/__init__.py``), so its
import is the earliest moment the package sees. The process's own start
(``/proc``) is when it was forked, which is too early where a shell ran
something else before it ``exec``'d Python (``sleep 20 && exec python
train.py``, or the last command of ``pip install ... && python train.py``,
which the shell execs); the CPU time the process has used since it was
forked is almost all Python's own start-up (a process waiting, as a
``sleep`` in another process, uses none), so now less that CPU time is
when Python began, within the little I/O the interpreter waited for.
"""

import time

AT = time.time() - time.process_time()
