"""Every ```python block of docs/library.md runs on its own.

Each block is written to a file and run in a fresh interpreter from the
repository root, with WORKDIR pointing at a copy of the tiny trained
workdir fixture (loading may write into a workdir).
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import repo

# Each example starts Python and compiles its model: minutes in all.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(repo.ROOT)
DOC = ROOT / 'docs' / 'library.md'
FIXTURE = pathlib.Path(repo.FIXTURES) / 'workdir_v1_flat'

_FENCE = re.compile(r'^```python\n(.*?)^```', re.DOTALL | re.MULTILINE)
_HEADING = re.compile(r'^#{1,6}\s+(.*)$', re.MULTILINE)


def _blocks() -> list[tuple[str, str]]:
  """(id, code) of each python block: its number and nearest heading."""
  text = DOC.read_text()
  out = []
  for i, match in enumerate(_FENCE.finditer(text), start=1):
    headings = _HEADING.findall(text, 0, match.start())
    title = headings[-1] if headings else 'top'
    slug = re.sub(r'[^a-z0-9]+', '-', title.lower()).strip('-')
    out.append((f'{i}-{slug}', match.group(1)))
  return out


BLOCKS = _blocks()


def test_doc_has_the_examples():
  assert len(BLOCKS) >= 4, f'{DOC} has {len(BLOCKS)} python blocks'


def _env(workdir: pathlib.Path) -> dict[str, str]:
  env = dict(os.environ)
  # conftest forces 8 host devices for the sharding tests; the examples run
  # as a user would, on the one CPU device.
  flags = ' '.join(f for f in env.get('XLA_FLAGS', '').split()
                   if not f.startswith('--xla_force_host_platform_device_count'))
  if flags:
    env['XLA_FLAGS'] = flags
  else:
    env.pop('XLA_FLAGS', None)
  env.setdefault('JAX_PLATFORMS', 'cpu')
  env['WORKDIR'] = str(workdir)
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (str(ROOT), env.get('PYTHONPATH')) if p)
  return env


@pytest.mark.parametrize('code', [c for _, c in BLOCKS],
                         ids=[i for i, _ in BLOCKS])
def test_block_runs(code, tmp_path):
  workdir = tmp_path / 'lm_shakespeare'
  shutil.copytree(FIXTURE, workdir)
  script = tmp_path / 'example.py'
  script.write_text(code)
  result = subprocess.run([sys.executable, str(script)], cwd=ROOT,
                          env=_env(workdir), capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, (
      f'exit status {result.returncode}\n--- code ---\n{code}\n'
      f'--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}')
