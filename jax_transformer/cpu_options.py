"""XLA:CPU's options this project's programs run with.

Set in ``XLA_FLAGS`` as a program starts (``cli.then_exit``), before JAX
starts its CPU backend, which reads them once; an option the environment
already names keeps the environment's value. Code that imports the
package's modules into its own program is left as its author set it.

* YNNPACK for dots only. XLA:CPU (jax 0.10) hands dots, reductions and
  elementwise work to YNNPACK; its reduction over the paper-base
  forward's logits ([512, 37000] floats, a loss's log-sum-exp) took 52 ms
  of a 630-ms forward in a profile on a 2-core Xeon (AVX-512, AMX), single
  threaded. With YNNPACK kept to dots, measured in one process,
  interleaved, against XLA's defaults: the forward 0.89x the time, the
  train step 1.00x, a GPT-2 small decoding step 1.00x (one row) and 1.03x
  (32 rows); the loss identical to the last bit.
"""

from __future__ import annotations

import os
import shlex

OPTIONS = ('--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT',)


def as_compiler_options() -> dict[str, str]:
  """OPTIONS as ``jax.stages.Lowered.compile(compiler_options=...)``
  takes them (for one program of a process that did not start with
  them)."""
  return dict(o.removeprefix('--').split('=', 1) for o in OPTIONS)


def apply() -> list[str]:
  """Adds OPTIONS to ``XLA_FLAGS`` where it does not name them; returns
  those added."""
  given = shlex.split(os.environ.get('XLA_FLAGS', ''))
  named = {o.split('=', 1)[0] for o in given}
  new = [o for o in OPTIONS if o.split('=', 1)[0] not in named]
  if new:
    os.environ['XLA_FLAGS'] = ' '.join(given + new)
  return new
