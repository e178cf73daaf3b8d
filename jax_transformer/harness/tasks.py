"""Running lm-eval tasks on a model: the tasks found and loaded first (one
sentence for an unknown task or data that cannot be reached), then
``lm_eval.simple_evaluate``, then lm-eval's table and its results file.

The bundled tasks (``tasks/``: ``shakespeare_next_line``,
``shakespeare_continue``, ``shakespeare_bpb``, the tag ``shakespeare``) are
always found; ``include_path`` adds a folder of task YAMLs. A task whose
data lies on the Hugging Face Hub runs where the Hub can be reached or the
data is in the local cache; anywhere else it is refused before the model is
read, with the Hub switched to offline so that nothing retries.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import pathlib
import shutil
import socket
import tempfile
from typing import Any, Sequence

import datasets.config
import huggingface_hub.constants
import lm_eval
import yaml
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable, make_table

from jax_transformer.errors import UsageError, named_line

BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tasks')
HUB = ('huggingface.co', 443)


@dataclasses.dataclass(frozen=True)
class Settings:
  """What a run of tasks asks, in lm-eval's names."""
  tasks: tuple[str, ...]
  num_fewshot: int | None = None
  limit: float | None = None       # a count (>= 1) or a fraction (< 1)
  include_path: str | None = None
  seed: int = 0
  log_samples: bool = False
  bootstrap_iters: int = 100000


def parse_tasks(text: str) -> tuple[str, ...]:
  names = tuple(t.strip() for t in text.split(',') if t.strip())
  if not names:
    raise UsageError('--tasks is empty; give task names separated by commas, '
                     'e.g. --tasks shakespeare_next_line,hellaswag.')
  return names


def parse_limit(text: str | float | None) -> float | None:
  """lm-eval's --limit: a count of documents per task, or a fraction."""
  if text is None:
    return None
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not value > 0 or (value >= 1 and value != int(value)):
    raise UsageError(f'--limit must be a positive count of documents or a '
                     f'fraction in (0, 1), got {text!r}.')
  return int(value) if value >= 1 else value


def hub_reachable(timeout: float = 3.0) -> bool:
  try:
    socket.create_connection(HUB, timeout=timeout).close()
    return True
  except OSError:
    return False


def go_offline() -> None:
  """Hub reads answer from the local cache or fail at once."""
  os.environ['HF_HUB_OFFLINE'] = os.environ['HF_DATASETS_OFFLINE'] = '1'
  datasets.config.HF_HUB_OFFLINE = True
  datasets.config.HF_DATASETS_OFFLINE = True
  huggingface_hub.constants.HF_HUB_OFFLINE = True


@functools.cache
def bundled_dir() -> str:
  """The bundled YAMLs with their data_files made absolute, in a folder of
  this process's (once): they name their data relative to the repository
  root, as lm-eval's own command line reads them from there, and are found
  so from any directory."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(BUNDLED)))
  out = tempfile.mkdtemp(prefix='jax_transformer_tasks_')
  atexit.register(shutil.rmtree, out, ignore_errors=True)
  for name in sorted(os.listdir(BUNDLED)):
    if not name.endswith('.yaml'):
      continue
    with open(os.path.join(BUNDLED, name), encoding='utf-8') as f:
      config = yaml.safe_load(f)
    files = config.get('dataset_kwargs', {}).get('data_files', {})
    for split, path in files.items():
      files[split] = os.path.join(root, path)
    with open(os.path.join(out, name), 'w', encoding='utf-8') as f:
      yaml.safe_dump(config, f)
  return out


def task_manager(include_path: str | None,
                 names: Sequence[str] = ()) -> TaskManager:
  """lm-eval's TaskManager over the bundled tasks, ``include_path`` and,
  unless every one of ``names`` is a task found there, lm-eval's own.

  Indexing lm-eval's own task YAMLs (about 14,000) takes 8 s at every
  start (a 2-core Xeon, 2026-12-06); a folder of a few, a millisecond. A
  task found in the folders resolves as it would in the whole index,
  where the folders take precedence; a tag or a group may gather tasks
  from lm-eval's own, so it gets the whole index.
  """
  paths = [bundled_dir()]
  if include_path is not None:
    if not os.path.isdir(include_path):
      raise UsageError(f'--include_path {include_path} is not a directory of '
                       'task YAML files.')
    paths.append(include_path)
  return (folders_alone(paths, names)
          or TaskManager(include_path=paths))


def folders_alone(paths: Sequence[str],
                  names: Sequence[str]) -> TaskManager | None:
  """A TaskManager over the folders ``paths`` alone where every one of
  ``names`` is a task in them (not a tag or a group), else None."""
  if not names:
    return None
  local = TaskManager(include_path=list(paths), include_defaults=False)
  return local if set(names) <= set(local.all_subtasks) else None


def load_tasks(settings: Settings) -> tuple[Any, dict]:
  """(the TaskManager, {task name: Task}), every document loaded.
  UsageError for an unknown task or data that cannot be read here."""
  manager = task_manager(settings.include_path, settings.tasks)
  unknown = [t for t in settings.tasks if not manager.match_tasks([t])]
  if unknown:
    raise UsageError(
        f'Unknown task {", ".join(map(repr, unknown))}: not among '
        "lm-eval's tasks, the bundled ones (shakespeare_next_line, "
        'shakespeare_continue, shakespeare_bpb) or the YAMLs under '
        '--include_path.')
  online = hub_reachable()
  if not online:
    go_offline()
  try:
    return manager, manager.load(list(settings.tasks))['tasks']
  except Exception as e:  # pylint: disable=broad-except
    # datasets raises many types (ConnectionError, FileNotFoundError, its
    # own): each is one sentence, naming the tasks.
    cause = (' from the Hugging Face Hub, which cannot be reached from '
             'here, and it is not in the local cache; run it once where the '
             'Hub is reachable, or give a local task (--include_path)'
             if not online else f' ({named_line(e)})')
    raise UsageError(f'The data of {", ".join(settings.tasks)} cannot be '
                     f'read{cause}.') from None


def check_fits(max_length: int, task_dict: dict,
               default_new_tokens: int) -> None:
  """Refuses a generation task whose new tokens (its max_gen_toks or an
  alias, else ``default_new_tokens``) leave no room for a context in a
  model of ``max_length`` (task_dict: name -> Task)."""
  for name, task in task_dict.items():
    if getattr(task.config, 'output_type', None) != 'generate_until':
      continue
    kwargs = normalize_gen_kwargs(
        dict(getattr(task.config, 'generation_kwargs', None) or {}),
        default_new_tokens)
    new = int(kwargs['max_gen_toks'])
    if new >= max_length:
      raise UsageError(
          f'Task {name} asks for {new} new tokens, which leaves no room '
          f"for a context in the model's {max_length}; lower its "
          'max_gen_toks.')


def evaluate(lm, settings: Settings, loaded: tuple | None = None) -> dict:
  """lm-eval's results dict for ``settings`` (``loaded``: what
  :func:`load_tasks` returned, when the caller loaded them first)."""
  manager, task_dict = loaded or load_tasks(settings)
  check_fits(lm.max_length, task_dict, lm.max_gen_toks)
  seed = settings.seed
  return lm_eval.simple_evaluate(
      # By name again: the task dict was loaded to refuse bad tasks early;
      # its data is cached now.
      model=lm, tasks=list(settings.tasks),
      num_fewshot=settings.num_fewshot, limit=settings.limit,
      log_samples=settings.log_samples, task_manager=manager,
      bootstrap_iters=settings.bootstrap_iters, random_seed=seed,
      numpy_random_seed=seed, torch_random_seed=None,
      fewshot_random_seed=seed)


def table(results: dict) -> str:
  """lm-eval's results table (and its groups', where there are any)."""
  text = make_table(results)
  if results.get('groups'):
    text += '\n' + make_table(results, 'groups')
  return text


def metrics(results: dict) -> dict[str, float]:
  """'task/metric' (or 'task/metric,filter' for a filter other than
  lm-eval's 'none') -> value, the numbers only (a metrics row)."""
  out = {}
  for task, values in results['results'].items():
    for key, value in values.items():
      metric, _, kept = key.partition(',')
      if (isinstance(value, (int, float)) and not isinstance(value, bool)
          and not metric.endswith('_stderr') and metric != 'sample_len'):
        # A task's filters (gsm8k's strict-match, flexible-extract) each
        # keep their figure.
        name = metric if kept in ('', 'none') else f'{metric},{kept}'
        out[f'{task}/{name}'] = float(value)
  return out


def write(results: dict, directory) -> list[str]:
  """results.json (lm-eval's results, as its tracker saves them) and, when
  samples were logged, samples_<task>.jsonl, into ``directory`` (an
  epath.Path or a local path); returns the names written."""
  directory = pathlib.Path(directory) if isinstance(directory, str) \
      else directory
  directory.mkdir(parents=True, exist_ok=True)
  samples = results.get('samples') or {}
  summary = {k: v for k, v in results.items() if k != 'samples'}
  (directory / 'results.json').write_text(json.dumps(
      summary, indent=2, default=handle_non_serializable, ensure_ascii=False))
  names = ['results.json']
  for task, rows in samples.items():
    name = f'samples_{task}.jsonl'
    (directory / name).write_text(''.join(
        json.dumps(r, default=handle_non_serializable, ensure_ascii=False)
        + '\n' for r in rows))
    names.append(name)
  return names


def run(lm, settings: Settings, directory=None,
        loaded: tuple | None = None) -> dict:
  """Evaluates and writes the files into ``directory`` (if given)."""
  results = evaluate(lm, settings, loaded)
  if directory is not None:
    write(results, directory)
  return results
