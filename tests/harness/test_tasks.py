"""The bundled tasks' data is what scripts/build_harness_tasks.py writes
from the plays' held-out speeches, and lm-eval finds every bundled task."""

import os

import build_harness_tasks
import pytest

from jax_transformer.harness import tasks


@pytest.mark.slow
def test_the_committed_task_data_is_what_the_builder_writes():
  documents = build_harness_tasks.documents()
  assert len(documents) == 3
  for name, docs in documents.items():
    with open(os.path.join(tasks.BUNDLED, name), encoding='utf-8') as f:
      assert f.read() == build_harness_tasks.jsonl(docs), name
    assert len(docs) > 300


def test_the_bundled_tasks_are_found_by_name_and_tag():
  manager = tasks.task_manager(None)
  for name in ('shakespeare_next_line', 'shakespeare_continue',
               'shakespeare_bpb', 'shakespeare'):
    assert manager.match_tasks([name]), name
  assert not manager.match_tasks(['no_such_task_x'])
  # Asked for bundled tasks by name, lm-eval's own are not indexed, and
  # the tasks resolve to the same YAMLs as in the whole index.
  names = ['shakespeare_bpb', 'shakespeare_continue']
  local = tasks.task_manager(None, names)
  assert 'hellaswag' in manager.all_tasks
  assert set(local.all_tasks) < set(manager.all_tasks)
  assert 'hellaswag' not in local.all_tasks
  for name in names:
    assert local._index[name].yaml_path == manager._index[name].yaml_path
  # A tag, or a task of lm-eval's own, gets the whole index.
  folders = [tasks.bundled_dir()]
  assert tasks.folders_alone(folders, ['shakespeare']) is None
  assert tasks.folders_alone(folders, ['shakespeare_bpb', 'hellaswag']) is None
  assert tasks.folders_alone(folders, []) is None


@pytest.mark.parametrize('text, value', [('5', 5), ('0.25', 0.25),
                                         ('200', 200)])
def test_limit_is_a_count_or_a_fraction(text, value):
  assert tasks.parse_limit(text) == value


@pytest.mark.parametrize('text', ['0', '-1', '1.5', 'many'])
def test_a_bad_limit_is_refused(text):
  with pytest.raises(tasks.UsageError, match='--limit'):
    tasks.parse_limit(text)
