"""The README and docs/ name only what exists: every link resolves, every
script flag, config field and file path they mention is real, and the
README stays short. The README's Python example runs as a file."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest
import repo
from absl import flags as absl_flags

from jax_transformer import cli
from jax_transformer.compile import flags as target_flags
from jax_transformer.train import recipes

ROOT = pathlib.Path(repo.ROOT)
DOCS = sorted([ROOT / 'README.md', *(ROOT / 'docs').glob('*.md')])
README_MAX_LINES = 250

# Flags every absl program (train.py) and every argparse script has.
COMMON_FLAGS = {'help', 'helpfull', 'flagfile'}


def doc_ids():
  return [str(p.relative_to(ROOT)) for p in DOCS]


def slug(heading: str) -> str:
  """GitHub's anchor for a heading."""
  text = re.sub(r'[`*]', '', heading.strip().lower())
  text = re.sub(r'[^\w\- ]', '', text)
  return text.replace(' ', '-')


def anchors(path: pathlib.Path) -> set[str]:
  seen, out = {}, set()
  for line in outside_code(path.read_text()).splitlines():
    match = re.match(r'^#+\s+(.*)', line)
    if match:
      base = slug(match.group(1))
      n = seen.get(base, 0)
      out.add(base if n == 0 else f'{base}-{n}')
      seen[base] = n + 1
  return out


def outside_code(text: str) -> str:
  """text without its fenced code blocks."""
  return re.sub(r'```.*?```', '', text, flags=re.S)


def code_blocks(text: str, language: str = '') -> list[str]:
  return re.findall(rf'```{language}\n(.*?)```', text, flags=re.S)


def test_the_readme_is_short():
  lines = (ROOT / 'README.md').read_text().count('\n')
  assert lines <= README_MAX_LINES, lines


@pytest.mark.parametrize('doc', DOCS, ids=doc_ids())
def test_every_link_resolves(doc):
  broken = []
  for target in re.findall(r'\]\(([^)\s]+)\)', outside_code(doc.read_text())):
    if re.match(r'^[a-z]+://', target) or target.startswith('mailto:'):
      continue
    path, _, anchor = target.partition('#')
    file = (doc.parent / path).resolve() if path else doc
    if not file.exists():
      broken.append(target)
    elif anchor and file.suffix == '.md' and anchor not in anchors(file):
      broken.append(target)
  assert not broken, broken


# ----------------------------------------------------------------------------
# Flags of train.py and the scripts.

def script_flags(script: pathlib.Path) -> set[str]:
  """The flags a script defines (argparse add_argument, absl DEFINE_*)."""
  text = script.read_text()
  tree = ast.parse(text)
  flags = set(COMMON_FLAGS)
  if 'parse_config_flags' in text:  # --config NAME[:preset] (jax_transformer.cli)
    flags.add('config')
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    name = getattr(node.func, 'attr', getattr(node.func, 'id', ''))
    strings = [a.value for a in node.args if isinstance(a, ast.Constant)
               and isinstance(a.value, str)]
    if name == 'add_argument':
      flags |= {s.lstrip('-') for s in strings if s.startswith('--')}
    elif name.startswith('DEFINE_') and strings:
      flags.add(strings[0])
      if name == 'DEFINE_bool':
        flags.add('no' + strings[0])
    elif name.startswith('define_') and hasattr(target_flags, name):
      # The flags defined once for every script (compile/flags.py), as
      # this call's literal keywords define them.
      values = absl_flags.FlagValues()
      getattr(target_flags, name)(values, **{
          k.arg: k.value.value for k in node.keywords
          if isinstance(k.value, ast.Constant)})
      flags |= set(values)
    elif name == 'parse' and getattr(
        getattr(node.func, 'value', None), 'id', '') == 'target_flags':
      keywords = {k.arg: getattr(k.value, 'value', None)
                  for k in node.keywords}
      if keywords.get('config') != 'never':  # compile/flags.parse
        flags.add('config')
  return flags


def commands(text: str) -> list[tuple[str, str]]:
  """(program, its arguments) of every `python PROGRAM ...` in text,
  continued lines joined."""
  text = text.replace('\\\n', ' ')
  found = re.findall(r'python3? ((?:scripts/)?\w+\.py)([^\n`|]*)', text)
  return [(program, args) for program, args in found
          if (ROOT / program).exists() or program.startswith('scripts/')
          or program == 'train.py']


@pytest.mark.parametrize('doc', DOCS, ids=doc_ids())
def test_every_flag_named_in_a_command_exists(doc):
  unknown = []
  for program, args in commands(doc.read_text()):
    path = ROOT / program
    assert path.exists(), f'{doc.name} runs {program}, which does not exist'
    defined = script_flags(path)
    for flag in re.findall(r'(?<![\w-])--([a-zA-Z_][\w-]*)(?![.\w])', args):
      if flag not in defined:
        unknown.append(f'{program} --{flag}')
  assert not unknown, unknown


# ----------------------------------------------------------------------------
# Config fields.

def known_fields() -> set[str]:
  """Every dotted field of every config (and preset) in configs/."""
  fields = set()

  def walk(node, prefix):
    for key, value in node.items():
      name = f'{prefix}{key}'
      fields.add(name)
      if hasattr(value, 'items'):
        walk(value, name + '.')

  walk(recipes.base_config(), '')
  for name in cli.config_names():
    walk(cli.load_config(name), '')
  return fields


@pytest.mark.parametrize('doc', DOCS, ids=doc_ids())
def test_every_config_field_named_exists(doc):
  fields = known_fields()
  text = doc.read_text()
  named = set(re.findall(r'--config\.([\w.]+)', text))
  # `config.a.b` and `model.x` in prose and tables.
  named |= set(re.findall(r'`config\.([\w.]+)', text))
  # Placeholders (`--config.a.b=value`, FIELD) and the file config.json.
  named -= {'a.b', 'json'}
  unknown = sorted(n for n in named
                   if n.rstrip('.') not in fields and not n.isupper())
  assert not unknown, unknown


def test_the_config_field_check_sees_a_wrong_name():
  assert 'optim.learning_rate' in known_fields()
  assert 'optim.learnin_rate' not in known_fields()


# ----------------------------------------------------------------------------
# Files.

PATH = re.compile(r'(?<![\w/.-])((?:jax_transformer|scripts|configs|tests|docs)'
                  r'/[\w./-]*\w)')


@pytest.mark.parametrize('doc', DOCS, ids=doc_ids())
def test_every_file_named_exists(doc):
  # A part in capitals is a placeholder: configs/NAME.py.
  named = {p for p in PATH.findall(doc.read_text())
           if not re.search(r'(^|/)[A-Z][A-Z_]+(\.|/|$)', p)}
  missing = sorted(p for p in named if not (ROOT / p.split(':')[0]).exists())
  assert not missing, missing


# ----------------------------------------------------------------------------
# The README's Python example, run as a file after only `pip install -e .`.

@pytest.mark.slow
def test_the_readme_example_runs_as_a_file_without_torch(tmp_path):
  (block,) = code_blocks((ROOT / 'README.md').read_text(), 'python')
  script = tmp_path / 'example.py'
  # Importing torch or transformers fails, as on a machine without them.
  script.write_text('import sys\nsys.modules["torch"] = None\n'
                    'sys.modules["transformers"] = None\n' + block)
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert '(2, 7, 37000) 63084544' in out.stdout


def test_the_flag_and_file_checks_see_wrong_names():
  (program, args), = commands('`python scripts/evaluate.py --workdir w '
                              '--no_such_flag 1`')
  flags = script_flags(ROOT / program)
  assert 'workdir' in flags and 'no_such_flag' not in flags
  assert 'config' in script_flags(ROOT / 'train.py')
  # Flags defined once in jax_transformer/compile/flags.py count too.
  assert {'aot_target', 'aot_slices'} <= script_flags(ROOT / 'train.py')
  assert {'target', 'slices', 'output'} <= script_flags(
      ROOT / 'scripts' / 'plan.py')
  assert PATH.findall('see `scripts/no_such.py`') == ['scripts/no_such.py']
