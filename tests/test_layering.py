"""The package's plan, kept: no import cycle, and no import from a lower
layer to a higher one.

The layers, bottom to top, are declared once here (``LAYERS``); a module
belongs to the layer of its subpackage (or, at the top, its own name). A
module may import its own layer and any layer below. Imports inside
functions count like any other: hiding one there does not hide it here.
"""

import ast
import pathlib
import re

import pytest
import repo

PACKAGE = pathlib.Path(repo.ROOT) / 'jax_transformer'

# Bottom to top. `jax_transformer/__init__.py` names its public values
# lazily from every layer and is above them all.
LAYERS = ('started', 'errors', 'fields', 'reserved_ids', 'cli', 'model', 'experiment',
          'data', 'runtime', 'decoding', 'interop', 'train', 'workdirs',
          'harness', 'serving', 'compile', 'plan', 'bench')


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def modules() -> dict[str, pathlib.Path]:
  return {module_name(p): p for p in PACKAGE.rglob('*.py')}


def imports_of(path: pathlib.Path, known: set[str]) -> set[str]:
  """The package modules a file imports, anywhere in it."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names} & known
    elif isinstance(node, ast.ImportFrom) and node.module in known:
      # `from pkg import sub` imports the module pkg.sub; `from pkg import
      # value` the package pkg itself.
      for alias in node.names:
        sub = f'{node.module}.{alias.name}'
        found.add(sub if sub in known else node.module)
  return found


def graph() -> dict[str, set[str]]:
  mods = modules()
  known = set(mods)
  return {m: imports_of(p, known) - {m} for m, p in mods.items()}


def layer(module: str) -> int:
  parts = module.split('.')
  if len(parts) == 1:  # jax_transformer/__init__.py
    return len(LAYERS)
  return LAYERS.index(parts[1])


def test_every_module_has_a_layer():
  for module in modules():
    layer(module)  # raises ValueError for a folder missing from LAYERS


def test_no_module_imports_a_higher_layer():
  upward = sorted(f'{m} -> {d}' for m, deps in graph().items()
                  for d in deps if layer(d) > layer(m))
  assert not upward, upward


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
  """One cycle of the graph as a list of modules, or None."""
  state: dict[str, int] = {}  # 1 on the path, 2 done
  path: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    path.append(node)
    for nxt in sorted(edges.get(node, ())):
      # A package's __init__ importing its own submodules is not a cycle.
      if state.get(nxt) == 1 and not node.startswith(nxt + '.'):
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    path.pop()
    state[node] = 2
    return None

  for node in sorted(edges):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_no_import_cycle():
  edges = {m: {d for d in deps if not m.startswith(d + '.')}
           for m, deps in graph().items()}
  assert find_cycle(edges) is None, ' -> '.join(find_cycle(edges))


@pytest.mark.parametrize('edges, cycle', [
    ({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}, True),
    ({'a': {'b'}, 'b': {'c'}, 'c': set()}, False),
])
def test_the_cycle_finder_finds_cycles(edges, cycle):
  assert (find_cycle(edges) is not None) == cycle


def test_the_layer_check_sees_an_upward_import(tmp_path):
  fake = tmp_path / 'm.py'
  fake.write_text('def f():\n  from jax_transformer.train import trainer\n')
  assert 'jax_transformer.train.trainer' in imports_of(fake, set(modules()))
  assert layer('jax_transformer.train.trainer') > layer(
      'jax_transformer.model.layers')


def test_imports_inside_functions_are_only_optional_dependencies():
  """Heavy optional packages (torch, transformers, fsspec's filesystems,
  pyarrow for Parquet corpora, google-auth and requests, which come with the
  gs:// packages and runtime/buckets.py asks a bucket with) may be imported
  where used; everything else is at the top, but for tensorboardX, which
  train/metrics.py imports with torch, boto3 and Google's storage client
  hidden (it would import them, seconds of every start)."""
  optional = ('torch', 'transformers', 'fsspec', 'pyarrow', 'tensorboardX',
              'google', 'requests', 'jax_transformer.interop.torch_reference')
  inner = []
  for path in PACKAGE.rglob('*.py'):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset:
        name = (node.module if isinstance(node, ast.ImportFrom)
                else node.names[0].name)
        if name.split('.')[0] not in optional and name not in optional:
          inner.append(f'{path.name}:{node.lineno} {name}')
  assert not inner, inner


def test_no_file_edits_sys_path():
  root = PACKAGE.parent
  files = [*PACKAGE.rglob('*.py'), *(root / 'scripts').glob('*.py'),
           *(root / 'tests').rglob('*.py'), *(root / 'configs').glob('*.py'),
           root / 'train.py']
  # An insert, append, extend, slice or assignment; split so that this
  # file passes its own check.
  edit = re.compile(r'sys\.' + r'path(\.(insert|append|extend)\b|\[|\s*\+?=)')
  offenders = [str(f.relative_to(root)) for f in files
               if edit.search(f.read_text())]
  assert not offenders, offenders
