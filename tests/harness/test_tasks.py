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


@pytest.mark.parametrize('text, value', [('5', 5), ('0.25', 0.25),
                                         ('200', 200)])
def test_limit_is_a_count_or_a_fraction(text, value):
  assert tasks.parse_limit(text) == value


@pytest.mark.parametrize('text', ['0', '-1', '1.5', 'many'])
def test_a_bad_limit_is_refused(text):
  with pytest.raises(tasks.UsageError, match='--limit'):
    tasks.parse_limit(text)
