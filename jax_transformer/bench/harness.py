"""The harness backend against lm-eval's own Hugging Face backend, one
process, the same checkpoint, tasks, documents and batch size.

The checkpoint is GPT-2 small's shape (12 layers of width 768, 1,024
positions, a 50,257-token vocabulary) at random weights, made by
transformers and saved with a byte-level BPE tokenizer trained here (the
model's vocabulary is larger than the tokenizer's, as a padded one is).
Both sides run the bundled tasks (``shakespeare_next_line``,
``shakespeare_bpb``, ``shakespeare_continue``) with ``--limit``
documents each through ``lm_eval.simple_evaluate``; each round runs each
side once, in alternating order (``timing.interleave``, no untimed
warm-up: the first round holds our compiles, which is what a user waits
for). The row: each side's median wall seconds, the median of per-round
ratios ours / theirs with its range, and each side's first round.

Needs the test extra (PyTorch, transformers, lm-eval's Hugging Face
backend).
"""

from __future__ import annotations

import os
import tempfile

import lm_eval
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jax_transformer.bench import timing
from jax_transformer.data import shakespeare
from jax_transformer.harness import JaxTransformerLM, tasks

TASKS = ('shakespeare_next_line', 'shakespeare_bpb', 'shakespeare_continue')
GOAL = 0.5  # our wall time over lm-eval's Hugging Face backend's, at most
VOCAB = 50257


def make_checkpoint(folder: str) -> str:
  """GPT-2 small's shape at random weights, with a BPE tokenizer trained
  on the plays' text, saved in ``folder``."""
  import torch  # noqa: PLC0415 (the test extra)
  import transformers  # noqa: PLC0415
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)).eval()
  model.save_pretrained(folder)
  source = shakespeare.default_source_dir()
  texts = [open(shakespeare.play_path(source, p), encoding='utf-8').read()
           for p in shakespeare.DEFAULT_PLAYS]
  backend = Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  backend.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=8000, special_tokens=['<|endoftext|>'],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, bos_token='<|endoftext|>',
      eos_token='<|endoftext|>', unk_token='<|endoftext|>').save_pretrained(
          folder)
  return folder


def run(rounds: int, limit: int, batch_size: int = 16) -> list[dict]:
  folder = make_checkpoint(tempfile.mkdtemp(prefix='harness_bench_'))
  manager = tasks.task_manager(None, TASKS)
  ours = JaxTransformerLM.from_workdir(folder, batch_size=batch_size)

  def side(model, **kwargs):
    return lambda: lm_eval.simple_evaluate(
        model=model, tasks=list(TASKS), limit=limit, task_manager=manager,
        bootstrap_iters=0, torch_random_seed=None, **kwargs)

  times = timing.interleave({
      'ours': side(ours),
      'hf': side('hf', model_args=f'pretrained={folder},dtype=float32',
                 batch_size=batch_size, device='cpu'),
  }, rounds, warmup=0)
  row = timing.summary(times, 'ours', 'hf')
  return [{'suite': 'harness', 'tasks': ','.join(TASKS), 'limit': limit,
           'batch_size': batch_size, 'ours_wall_s': row['ours_s'],
           'hf_wall_s': row['hf_s'], 'ratio': row['ratio'],
           'ratio_min': row['ratio_min'], 'ratio_max': row['ratio_max'],
           'ours_first_round_s': times['ours'][0],
           'hf_first_round_s': times['hf'][0], 'rounds': rounds,
           'compiled_programs': len(ours.scorer.shapes), 'goal': GOAL,
           'cores': os.cpu_count(),
           'load_average': timing.load_average()}]
