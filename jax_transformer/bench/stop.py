"""Signal to exit: how long ``train.py`` takes from SIGTERM to its exit on
each shipped config, as a preemption notice sees it.

Each config trains in a fresh workdir from the repository root until its
train step has compiled and ``settle_s`` more seconds have passed; then it
gets SIGTERM, and the clock runs until the process has ended. In between,
the run finishes the steps in flight (at most two; one when a step takes
over a second, see trainer.SLOW_STEP_S), abandons an
evaluation between batches, saves a checkpoint, waits for it to be
written and exits 75. A config's data is prepared before its clock, in
the run itself, so the first row of a fresh machine also prepares it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

# (config, extra flags): the shipped configs at sizes that run on a CPU
# host; wmt_base needs WMT14 (a download), so its model trains on the
# offline Ding pairs at a smaller batch.
CONFIGS = (
    ('lm_shakespeare', ()),
    ('translate_ende', ()),
    ('translate_ende:cpu30', ()),
    ('gpt2_small:shakespeare', ()),
    ('wmt_base', ('--config.data.name=ding_en_de',
                  '--config.data.vocab_size=8000', '--config.batch_size=16',
                  '--config.eval_batch_size=16')),
)
COMPILED = 'Compiled the train step in'


def measure(config: str, flags: tuple[str, ...], settle_s: float = 5.0,
            timeout_s: float = 1800.0) -> dict:
  """One config's row: signal_to_exit_s, the exit status, the step saved
  and the seconds it trained from its compiled step to the signal."""
  with tempfile.TemporaryDirectory(prefix='stop_bench_') as work:
    workdir = os.path.join(work, 'run')
    proc = subprocess.Popen(
        [sys.executable, '-u', 'train.py', '--config', config,
         '--workdir', workdir, '--config.num_steps=1000000', *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, compiled, compiled_at = [], threading.Event(), []

    def read():
      for line in proc.stdout:
        lines.append(line)
        if COMPILED in line and not compiled.is_set():
          compiled_at.append(time.perf_counter())
          compiled.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
      if not compiled.wait(timeout_s):
        raise RuntimeError(f'{config}: no compiled train step within '
                           f'{timeout_s:.0f} s:\n{"".join(lines)[-2000:]}')
      time.sleep(settle_s)
      proc.send_signal(signal.SIGTERM)
      signalled = time.perf_counter()
      status = proc.wait(timeout=timeout_s)
      took = time.perf_counter() - signalled
    finally:
      proc.kill()
    reader.join(timeout=10)
    out = ''.join(lines)
    saved = re.findall(r'SIGTERM: saved step (\d+)', out)
    return {'suite': 'stop', 'config': config, 'flags': list(flags),
            'signal_to_exit_s': round(took, 2), 'exit_status': status,
            'saved_step': int(saved[-1]) if saved else None,
            'compiled_to_signal_s': round(signalled - compiled_at[0], 2)}


def run(configs: tuple[str, ...] | None = None):
  """Rows for the named configs (default: all of CONFIGS), one by one."""
  for config, flags in CONFIGS:
    if configs is None or config in configs:
      yield measure(config, flags)
