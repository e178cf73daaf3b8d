"""scripts/evaluate.py --tasks and config.eval_harness, run as users run
them: a tiny LM trained with tasks scored during training, then scored
again from its workdir, from a Hugging Face folder given directly and from
a workdir import_params.py made; bad input is one line and exit 2."""

import json
import os
import shutil
import time

import harness_models
import pytest
import train_runs
from script_helpers import run_script

# One worker trains the module's workdirs once (fixtures are per worker).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('evaluate_tasks')]

TASKS = 'shakespeare_next_line,shakespeare_continue'
OWN_TASK = """task: own_lines
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
target_delimiter: "\\n"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
"""


@pytest.fixture(scope='module')
def trained(tmp_path_factory, fake_data_dir):
  """A tiny LM (128 positions, room for 64 new tokens) trained on 8 host
  devices with two bundled tasks scored at its evaluations."""
  workdir = tmp_path_factory.mktemp('harness') / 'run'
  out = train_runs.train(
      workdir, fake_data_dir, '--config.model.max_len=128',
      f'--config.eval_harness.tasks={TASKS}',
      '--config.eval_harness.limit=4')
  return workdir, out


def rows(workdir):
  with open(workdir / 'metrics.jsonl') as f:
    return [json.loads(line) for line in f]


def test_tasks_are_scored_during_training(trained):
  workdir, out = trained
  assert 'lm-eval tasks at step 3:' in out and '|acc' in out
  scored = [r for r in rows(workdir) if 'harness/shakespeare_next_line/acc'
            in r]
  assert [r['step'] for r in scored][:2] == [3, 6]
  for r in scored:
    # limit=4: the mean of four documents' 0 or 1.
    right = 4 * r['harness/shakespeare_next_line/acc']
    assert right == pytest.approx(round(right), abs=1e-9), r
    assert 'harness/shakespeare_continue/chrf' in r


def test_evaluate_prints_lm_evals_table_for_a_workdir(trained, tmp_path):
  workdir, _ = trained
  # A task of one's own, from a folder given with --include_path.
  data = tmp_path / 'own.jsonl'
  data.write_text(''.join(json.dumps(
      {'context': 'Ham.\nTo be, or not to be,', 'choices': [
          'that is the question:', 'xq zzv'], 'label': 0}) + '\n'
      for _ in range(3)))
  tasks_dir = tmp_path / 'tasks'
  tasks_dir.mkdir()
  (tasks_dir / 'own.yaml').write_text(OWN_TASK.format(data=data))
  cache = tmp_path / 'xla'
  result = run_script('evaluate', '--workdir', str(workdir), '--tasks',
                      f'{TASKS},own_lines', '--include_path', str(tasks_dir),
                      '--limit', '4', '--log_samples', '--batch_size', '8',
                      f'--compilation_cache_dir={cache}')
  assert result.returncode == 0, result.stderr[-3000:]
  # Its programs are kept for the next evaluation of these shapes.
  assert any(cache.iterdir())
  assert '|shakespeare_next_line|' in result.stdout
  assert '|own_lines' in result.stdout
  assert 'scoring programs compiled (at most' in result.stderr
  out = workdir / 'eval' / 'harness-step6'
  results = json.loads((out / 'results.json').read_text())
  assert set(results['results']) == {'shakespeare_next_line',
                                     'shakespeare_continue', 'own_lines'}
  assert results['n-samples']['own_lines']['effective'] == 3
  samples = (out / 'samples_shakespeare_next_line.jsonl').read_text()
  assert len(samples.splitlines()) == 4


@pytest.fixture(scope='module')
def hf_folder(tmp_path_factory):
  return harness_models.save('llama3', tmp_path_factory.mktemp('llama'))


def test_a_hugging_face_folder_and_its_import_score_alike(hf_folder,
                                                          tmp_path):
  direct = run_script('evaluate', '--workdir', hf_folder, '--tasks',
                      'shakespeare_next_line', '--limit', '6',
                      '--output_path', str(tmp_path / 'direct'))
  assert direct.returncode == 0, direct.stderr[-3000:]
  assert not os.path.exists(os.path.join(hf_folder, 'eval'))
  imported = tmp_path / 'imported'
  made = run_script('import_params', '--from', hf_folder, '--config',
                    'lm_shakespeare', '--workdir', str(imported))
  assert made.returncode == 0, made.stderr[-3000:]
  again = run_script('evaluate', '--workdir', str(imported), '--tasks',
                     'shakespeare_next_line', '--limit', '6')
  assert again.returncode == 0, again.stderr[-3000:]
  a = json.loads((tmp_path / 'direct' / 'results.json').read_text())
  b = json.loads((imported / 'eval' / 'harness-step0' / 'results.json'
                  ).read_text())
  for key in ('acc,none', 'acc_norm,none'):
    assert a['results']['shakespeare_next_line'][key] == b['results'][
        'shakespeare_next_line'][key]


def refused(*args):
  start = time.perf_counter()
  result = run_script('evaluate', *args, env={'HF_HUB_OFFLINE': '0'})
  seconds = time.perf_counter() - start
  assert result.returncode == 2, result.stderr[-3000:]
  lines = [line for line in result.stderr.splitlines()
           if line.startswith('evaluate.py:')]
  assert len(lines) == 1 and 'Traceback' not in result.stderr, result.stderr
  return lines[0], seconds


def test_bad_input_is_one_sentence_and_exit_2(trained, tmp_path):
  workdir, _ = trained
  line, _ = refused('--workdir', str(workdir), '--tasks', 'no_such_task_x')
  assert "Unknown task 'no_such_task_x'" in line
  # lm-eval's HellaSwag reads the Hugging Face Hub, which this machine
  # cannot reach: refused before the model is read, with no retries.
  line, seconds = refused('--workdir', str(workdir), '--tasks', 'hellaswag')
  assert 'Hugging Face Hub' in line and 'hellaswag' in line
  assert seconds < 60
  line, _ = refused('--workdir', str(workdir), '--tasks',
                    'shakespeare_next_line', '--limit', '1.5')
  assert '--limit' in line
  line, _ = refused('--workdir', str(workdir), '--limit', '3')
  assert 'go with --tasks' in line
  # An encoder-decoder: refused, saying how it is scored.
  ende = tmp_path / 'ende'
  shutil.copytree(workdir, ende)
  config = json.loads((ende / 'config.json').read_text())
  config['model_kind'] = 'encoder_decoder'
  (ende / 'config.json').write_text(json.dumps(config))
  line, _ = refused('--workdir', str(ende), '--tasks',
                    'shakespeare_next_line')
  assert 'encoder-decoder' in line and 'BLEU' in line
