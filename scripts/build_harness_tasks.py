"""Writes the bundled lm-eval tasks' data from the plays' held-out text.

    python scripts/build_harness_tasks.py   # rewrites harness/tasks/*.jsonl

The speeches are the ``shakespeare`` dataset's validation paragraphs (the
last 10% of each play, which the default job never trains on). Three
tasks read them (their YAMLs sit beside the files):

  shakespeare_next_line  multiple choice: a speech's opening lines, then
                         its true next line among three lines of other
                         held-out speeches (acc, acc_norm)
  shakespeare_continue   generate the next line, stopped at a newline
                         (exact_match, chrF)
  shakespeare_bpb        rolling log-likelihood of whole speeches
                         (word and byte perplexity, bits per byte)

Deterministic (seeded); ``tests/harness/test_tasks.py`` checks that the
committed files are what this writes.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Sequence

from jax_transformer import cli
from jax_transformer.data import shakespeare

TASKS_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'jax_transformer', 'harness', 'tasks')
CHOICES = 4
MAX_CONTEXT_LINES = 4
SEED = 0


def held_out_speeches() -> list[list[str]]:
  """Each validation speech as its lines (the speaker's heading first),
  in play order; stage directions and headings left out."""
  source = shakespeare.default_source_dir()
  speeches = []
  for play in shakespeare.DEFAULT_PLAYS:
    with open(shakespeare.play_path(source, play), encoding='utf-8') as f:
      _, validation = shakespeare.split_play(f.read())
    for paragraph in validation:
      lines = paragraph.split('\n')
      if (len(lines) >= 3 and lines[0].endswith('.')
          and not lines[0].startswith('[')):
        speeches.append(lines)
  return speeches


def next_line_docs(speeches: Sequence[list[str]], rng: random.Random
                   ) -> list[dict]:
  lines = [line for s in speeches for line in s[1:]]
  docs = []
  for lines_of in speeches:
    cut = min(len(lines_of) - 1, MAX_CONTEXT_LINES)
    answer = lines_of[cut]
    others = rng.sample([x for x in lines if x != answer], CHOICES - 1)
    label = rng.randrange(CHOICES)
    choices = others[:label] + [answer] + others[label:]
    docs.append({'context': '\n'.join(lines_of[:cut]), 'choices': choices,
                 'label': label})
  return docs


def continue_docs(speeches: Sequence[list[str]]) -> list[dict]:
  return [{'context': '\n'.join(s[:2]) + '\n', 'target': s[2]}
          for s in speeches]


def bpb_docs(speeches: Sequence[list[str]]) -> list[dict]:
  return [{'text': '\n'.join(s)} for s in speeches]


def documents() -> dict[str, list[dict]]:
  """File name -> its documents."""
  speeches = held_out_speeches()
  rng = random.Random(SEED)
  return {'shakespeare_next_line.jsonl': next_line_docs(speeches, rng),
          'shakespeare_continue.jsonl': continue_docs(speeches),
          'shakespeare_bpb.jsonl': bpb_docs(speeches)}


def jsonl(docs: Sequence[dict]) -> str:
  return ''.join(json.dumps(d, ensure_ascii=False) + '\n' for d in docs)


@cli.entry_point('build_harness_tasks.py')
def main(argv: Sequence[str] | None = None) -> int:
  del argv
  for name, docs in documents().items():
    with open(os.path.join(TASKS_DIR, name), 'w', encoding='utf-8') as f:
      f.write(jsonl(docs))
    print(f'{name}: {len(docs)} documents')
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
