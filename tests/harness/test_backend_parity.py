"""The backend against lm-eval's own Hugging Face backend, on the same tiny
checkpoints and the bundled tasks: every request's log-likelihood, every
greedy flag, every generated text and every metric."""

import math

import harness_models
import lm_eval
import pytest
import repo
import transformers

from jax_transformer.harness import JaxTransformerLM, tasks

TASKS = ['shakespeare_next_line', 'shakespeare_bpb', 'shakespeare_continue']
LIMIT = 12
# A request's log-likelihood sums up to a few hundred float32 terms of
# about -6 each (two implementations, two summation orders).
RELATIVE = 1e-4

# One worker builds each checkpoint's results once (module fixtures are
# per worker).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('backend_parity')]


def evaluate(model, **kwargs):
  return lm_eval.simple_evaluate(
      model=model, tasks=TASKS, limit=LIMIT, log_samples=True,
      bootstrap_iters=0, task_manager=tasks.task_manager(None, TASKS), **kwargs)


@pytest.fixture(scope='module', params=['gpt2', 'llama3'])
def both(request, tmp_path_factory):
  """(ours, lm-eval's Hugging Face backend's) results on one checkpoint."""
  mp = pytest.MonkeyPatch()
  mp.chdir(repo.ROOT)  # the bundled tasks' data_files are relative
  try:
    folder = harness_models.save(
        request.param, tmp_path_factory.mktemp(request.param))
    lm = JaxTransformerLM.from_workdir(folder, batch_size=8)
    ours = evaluate(lm)
    theirs = evaluate('hf', model_args=f'pretrained={folder},dtype=float32',
                      batch_size=8, device='cpu')
  finally:
    mp.undo()
  return request.param, dict(ours, lm=lm), theirs, folder


def answers(results, task):
  return [r['resps'][i][0] for r in results['samples'][task]
          for i in range(len(r['resps']))]


@pytest.mark.parametrize('task', ['shakespeare_next_line', 'shakespeare_bpb'])
def test_log_likelihoods_equal_the_hf_backends(both, task):
  _, ours, theirs, _ = both
  a, b = answers(ours, task), answers(theirs, task)
  assert len(a) == len(b) >= LIMIT
  for x, y in zip(a, b):
    if isinstance(y, (list, tuple)):  # (log-likelihood, is greedy)
      assert math.isclose(float(x[0]), float(y[0]), rel_tol=RELATIVE,
                          abs_tol=RELATIVE)
      assert bool(x[1]) == bool(y[1])
    else:  # a rolling log-likelihood
      assert math.isclose(float(x), float(y), rel_tol=RELATIVE)


def test_greedy_generations_equal_the_hf_backends(both):
  family, ours, theirs, _ = both
  a = answers(ours, 'shakespeare_continue')
  b = answers(theirs, 'shakespeare_continue')
  assert a == b
  # Random weights still write something, so equality is not of blanks.
  assert sum(map(len, a)) > 0, family


def test_the_task_metrics_agree(both):
  _, ours, theirs, _ = both
  for task in TASKS:
    mine, hf = ours['results'][task], theirs['results'][task]
    numbers = {k for k, v in hf.items() if isinstance(v, float)
               and 'stderr' not in k}
    assert numbers, task
    for key in numbers:
      assert math.isclose(mine[key], hf[key], rel_tol=1e-4), (task, key)


def test_the_bos_convention_is_the_checkpoints(both):
  """Llama's tokenizer adds BOS to a text, GPT-2's does not; the backend
  encodes as transformers' tokenizer of the folder does."""
  family, ours, _, folder = both
  lm = ours['lm']
  hf = transformers.AutoTokenizer.from_pretrained(folder)
  for text in ('Ham.\nTo be', '', 'x y  z'):
    assert lm.tok_encode(text) == hf(text).input_ids
    assert lm.tok_encode(text, add_special_tokens=False) == hf(
        text, add_special_tokens=False).input_ids
  assert (lm.tok_encode('To be')[0] == 1) == harness_models.ADDS_BOS[family]
