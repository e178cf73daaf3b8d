"""Load a scripts/NAME.py as a module, to call its main() in-process."""

import importlib.util
import os

from repo import SCRIPTS


def load_script(name: str):
  spec = importlib.util.spec_from_file_location(
      f'{name}_script', os.path.join(SCRIPTS, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
