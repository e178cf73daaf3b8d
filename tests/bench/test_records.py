"""The benchmark record and the docs' tables made from it
(jax_transformer/bench/record.py, documented.py, scripts/report.py)."""

import subprocess

import script_helpers

from jax_transformer.bench import documented, record

REPORT = script_helpers.load_script('report')


def test_the_docs_measured_tables_are_the_records():
  """README's and performance.md's tables are what the record makes: a
  figure typed by hand, one no record holds, or one whose measured files
  changed since its record without being marked stale fails here."""
  for path, text in REPORT.made().items():
    assert path.read_text() == text, (
        f'{path.name}: run python scripts/report.py (the table differs '
        'from the record)')


def test_every_figure_in_the_tables_names_its_commit_and_machine():
  for figure, rec, got in REPORT.found(record.read()):
    assert rec['commit'] and rec['machine']['cpu'] and got['n'] >= 1
    assert rec['suite'] == figure.suite


def test_figures_take_a_rows_own_range_or_the_range_over_rounds():
  rows = [{'suite': 's', 'model': 'm', 'ratio': 0.8, 'ratio_min': 0.7,
           'ratio_max': 0.95, 'rounds': 5},
          {'suite': 's', 'side': 'a', 'round': 0, 'seconds': 3.0},
          {'suite': 's', 'side': 'a', 'round': 1, 'seconds': 1.0},
          {'suite': 's', 'side': 'a', 'round': 2, 'seconds': 2.0}]
  got = record.figures(rows)
  assert got['s/m/ratio'] == {'median': 0.8, 'min': 0.7, 'max': 0.95,
                              'n': 5}
  assert got['s/a/seconds'] == {'median': 2.0, 'min': 1.0, 'max': 3.0,
                                'n': 3}
  assert 's/m/ratio_min' not in got and 's/a/round' not in got


def test_a_figure_is_stale_once_what_it_measures_changed():
  first = subprocess.run(['git', 'rev-list', '--max-parents=0', 'HEAD'],
                         cwd=record.ROOT, capture_output=True, text=True,
                         check=True).stdout.split()[0]
  figure = documented.FIGURES[0]
  rec = {'commit': first, 'changed_tree': False}
  got = {'median': 0.9, 'min': 0.8, 'max': 1.0, 'n': 5}
  assert '**stale**' in documented.cell(figure, rec, got)
  head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=record.ROOT,
                        capture_output=True, text=True,
                        check=True).stdout.strip()
  # A path untouched since HEAD: not stale (a clean checkout, as CI's).
  fresh = documented.Figure('x', 's', {}, 'ratio', '{m:.2f}x', 'c', 'd',
                            ('pyproject.toml',))
  changed = documented.changed_since(head, ('pyproject.toml',))
  cell = documented.cell(fresh, {'commit': head, 'changed_tree': False}, got)
  assert ('**stale**' in cell) == bool(changed)
  assert cell.startswith('0.90x')


def test_a_record_says_what_ran_where(tmp_path):
  rows = [{'suite': 'cpu', 'model': 'm', 'step': 'train', 'ratio': 0.9,
           'ratio_min': 0.8, 'ratio_max': 1.1, 'rounds': 5}]
  rec = record.make('cpu', rows, ['--suite', 'cpu'], 5, 1.0, 2.0)
  path = tmp_path / 'r.jsonl'
  record.append(rec, path)
  record.append(rec, path)
  back = record.read(path)
  assert len(back) == 2 and back[0] == rec
  assert rec['machine']['cores'] >= 1 and isinstance(rec['machine']['isa'],
                                                     list)
  assert len(rec['commit']) == 40 and rec['figures']['cpu/m/train/ratio'][
      'median'] == 0.9


def test_every_predicted_cell_has_a_record():
  """README's predicted table: each shipped config on each target is a
  compile kept in docs/records/predicted.jsonl (compile_at_size.py
  --record), not a figure typed by hand."""
  predictions = record.read(record.PREDICTED)
  for target in documented.PREDICTED_TARGETS:
    for config in documented.PREDICTED_CONFIGS:
      hit = documented.newest_prediction(predictions, target, config)
      assert hit is not None, (target, config)
      rec, row = hit
      assert rec['commit'] and 0 < row['predicted_mfu'] <= 1


def test_a_prediction_of_an_older_step_model_is_stale():
  from jax_transformer.compile import step_model
  rec = {'commit': None}
  row = {'predicted_mfu': 0.5, 'link_share': 0.1,
         'cost_version': step_model.COST_VERSION - 1}
  assert 'stale' in documented.prediction_cell(rec, row)
  # The current version, at an unknown commit: every file it reads counts
  # as changed.
  row['cost_version'] = step_model.COST_VERSION
  assert 'stale' in documented.prediction_cell(rec, row)


def test_a_tree_changed_only_in_its_records_is_unchanged(tmp_path):
  """Suites run one after another append to the record before a commit:
  that is no change to what they measure; any other file's is."""
  def git(*args):
    subprocess.run(['git', '-c', 'user.email=t@t', '-c', 'user.name=t',
                    *args], cwd=tmp_path, check=True, capture_output=True)
  records = tmp_path / 'docs' / 'records'
  records.mkdir(parents=True)
  (records / 'measured.jsonl').write_text('{}\n')
  (tmp_path / 'model.py').write_text('x = 1\n')
  git('init', '-q')
  git('add', '-A')
  git('commit', '-qm', 'first')
  assert record.commit(tmp_path)['changed_tree'] is False
  with (records / 'measured.jsonl').open('a') as f:
    f.write('{}\n')
  assert record.commit(tmp_path)['changed_tree'] is False
  (tmp_path / 'model.py').write_text('x = 2\n')
  assert record.commit(tmp_path)['changed_tree'] is True


def test_performance_md_keeps_each_machines_newest_figure_readme_the_newest():
  """Goals hold per machine: a figure measured on two machines is in
  performance.md's table once per machine (each its newest there), in
  README's once (the newest of all)."""
  def rec(cpu, isa, ratio, date):
    rows = [{'suite': 'cpu', 'model': 'transformer_base', 'step': 'train',
             'ratio': ratio}]
    return {'suite': 'cpu', 'commit': None, 'changed_tree': False,
            'date': date, 'load_before': 1.0, 'load_after': 1.0,
            'machine': {'cpu': cpu, 'cores': 2, 'isa': isa},
            'figures': record.figures(rows), 'rows': rows}
  records = [rec('Xeon', ['avx2', 'avx512f', 'amx_tile'], 0.9, 'day 1'),
             rec('EPYC', ['avx2', 'avx512f'], 0.8, 'day 2'),
             rec('Xeon', ['avx2', 'avx512f', 'amx_tile'], 0.7, 'day 3')]
  train = [line for line in REPORT.performance_table(records).splitlines()
           if 'paper-base train step against' in line]
  assert len(train) == 2
  assert '0.70x' in train[0] and 'Xeon, 2 cores, AVX-512, AMX' in train[0]
  assert '0.80x' in train[1] and 'EPYC, 2 cores, AVX-512 |' in train[1]
  readme = [line for line in REPORT.readme_table(records).splitlines()
            if 'paper-base train step against' in line]
  assert len(readme) == 1 and '0.70x' in readme[0]
