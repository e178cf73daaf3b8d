"""Scripts for tests: load one as a module to call its main() in-process,
or run one as a user does."""

import importlib.util
import os
import subprocess
import sys

from repo import ROOT, SCRIPTS


def load_script(name: str):
  spec = importlib.util.spec_from_file_location(
      f'{name}_script', os.path.join(SCRIPTS, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_script(name: str, *args: str, env: dict | None = None,
               timeout: float = 900) -> subprocess.CompletedProcess:
  """scripts/NAME.py run as a user runs it, from the repository root, on
  this host's CPU; its exit status and output."""
  full_env = dict(os.environ, JAX_PLATFORMS='cpu', TPU_SKIP_MDS_QUERY='1',
                  **(env or {}))
  return subprocess.run(
      [sys.executable, os.path.join(SCRIPTS, f'{name}.py'), *args],
      cwd=ROOT, env=full_env, capture_output=True, text=True,
      timeout=timeout)
