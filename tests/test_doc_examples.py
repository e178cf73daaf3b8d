"""Every ```python block of every docs/*.md runs as written, as a file.

Each block is written to a file and run in a fresh interpreter from the
repository root, as a user would run it, with:

- WORKDIR: a fresh copy of the tiny trained workdir fixture (an
  lm_shakespeare:tiny run of 3 steps; loading may write into a workdir);
- TFDS_DATA_DIR: the session's shared directory of real corpora
  (conftest's real_data_dir), where a block's data.prepare builds a dataset
  once and later blocks reuse it;
- EXPORT, for a block that reads it: the `ende.pt` that
  docs/export_import.md's first command writes, made by that command
  (scripts/export.py --format torch --verify) from a translate_ende:tiny
  workdir trained for 2 steps on the real Ding corpus.

A block that needs a file the docs make with a shell command reads its path
from the environment, with the doc's name as the default.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import repo
import train_runs

# Each example starts Python and compiles its model: minutes in all.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(repo.ROOT)
DOCS = sorted((ROOT / 'docs').glob('*.md'))
FIXTURE = pathlib.Path(repo.FIXTURES) / 'workdir_v1_flat'
TIMEOUT_S = 300

_FENCE = re.compile(r'^```python\n(.*?)^```', re.DOTALL | re.MULTILINE)
_ANY_FENCE = re.compile(r'^```.*?^```', re.DOTALL | re.MULTILINE)
_HEADING = re.compile(r'^#{1,6}\s+(.*)$', re.MULTILINE)


def _slug(title: str) -> str:
  return re.sub(r'[^a-z0-9]+', '-', title.lower()).strip('-')


def _blocks(doc: pathlib.Path) -> list[tuple[str, str]]:
  """(id, code) of each python block of doc: `<doc>-<n>-<heading slug>`,
  n counting from 1 in the doc, the heading the nearest one above (not a
  `# comment` inside a code block)."""
  text = doc.read_text()
  prose = _ANY_FENCE.sub(lambda m: ' ' * len(m.group()), text)  # same offsets
  out = []
  for n, match in enumerate(_FENCE.finditer(text), start=1):
    headings = _HEADING.findall(prose, 0, match.start())
    title = _slug(headings[-1]) if headings else 'top'
    out.append((f'{doc.stem}-{n}-{title}', match.group(1)))
  return out


BLOCKS = [block for doc in DOCS for block in _blocks(doc)]


@pytest.mark.parametrize('doc', DOCS, ids=[d.stem for d in DOCS])
def test_every_python_block_is_found(doc):
  opened = doc.read_text().count('```python\n')
  found = len(_blocks(doc))
  # So a doc with python blocks yields every one of them, at least one.
  assert found == opened, f'{doc.name}: {opened} ```python fences, {found} read'
  if doc.name == 'library.md':
    assert found >= 4, f'{doc.name} has {found} python blocks'


@pytest.fixture(scope='session')
def ende_export(real_data_dir, tmp_path_factory):
  """docs/export_import.md's `python scripts/export.py --workdir
  runs/translate_ende --format torch --out ende.pt --verify`, run on a
  translate_ende:tiny workdir trained for 2 steps; the path of ende.pt."""
  root = tmp_path_factory.mktemp('export')
  workdir = root / 'translate_ende'
  train_runs.train(workdir, real_data_dir, '--config.num_steps=2',
                   '--config.eval_bleu_examples=0', devices=1,
                   config='translate_ende')
  out = root / 'ende.pt'
  result = subprocess.run(
      [sys.executable, str(ROOT / 'scripts' / 'export.py'), '--workdir',
       str(workdir), '--format', 'torch', '--out', str(out), '--verify'],
      cwd=ROOT, env=_env(), capture_output=True, text=True,
      timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (root / 'ende.json').exists() and (root / 'ende.tokenizer').is_dir()
  return out


@pytest.fixture(scope='session')
def served(tmp_path_factory):
  """docs/serving.md's `python scripts/serve.py --workdir
  runs/lm_shakespeare`, run on a copy of the tiny workdir fixture (so the
  model is named lm_shakespeare); the base URL its clients use."""
  from serving.server_process import Server
  workdir = tmp_path_factory.mktemp('served') / 'lm_shakespeare'
  shutil.copytree(FIXTURE, workdir)
  server = Server(workdir, key=None)
  yield server.base_url
  assert server.stop() == 0, server.output()


# A block that reads one of these from the environment gets the fixture's
# value: a path, or the URL of a server.
NEEDS = {'EXPORT': 'ende_export', 'SERVER': 'served'}


def _env(**extra: str) -> dict[str, str]:
  env = dict(os.environ)
  # conftest forces 8 host devices for the sharding tests; the examples run
  # as a user would, on the one CPU device (compiled quickly, as every CPU
  # process of the session: xla_flags.py).
  flags = ' '.join(f for f in env.get('XLA_FLAGS', '').split()
                   if not f.startswith('--xla_force_host_platform_device_count'))
  if flags:
    env['XLA_FLAGS'] = flags
  else:
    env.pop('XLA_FLAGS', None)
  env.setdefault('JAX_PLATFORMS', 'cpu')
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (str(ROOT), env.get('PYTHONPATH')) if p)
  env.update(extra)
  return env


@pytest.mark.parametrize('code', [c for _, c in BLOCKS],
                         ids=[i for i, _ in BLOCKS])
def test_block_runs(code, tmp_path, real_data_dir, request):
  workdir = tmp_path / 'lm_shakespeare'
  shutil.copytree(FIXTURE, workdir)
  extra = {'WORKDIR': str(workdir), 'TFDS_DATA_DIR': real_data_dir}
  for name, fixture in NEEDS.items():
    if re.search(rf'environ(\.get\(|\[)[\'"]{name}[\'"]', code):
      extra[name] = str(request.getfixturevalue(fixture))
  script = tmp_path / 'example.py'
  script.write_text(code)
  result = subprocess.run([sys.executable, str(script)], cwd=ROOT,
                          env=_env(**extra), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
  assert result.returncode == 0, (
      f'exit status {result.returncode}\n--- code ---\n{code}\n'
      f'--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}')
