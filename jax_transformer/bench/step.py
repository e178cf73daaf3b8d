"""Our jitted train step and forward against PyTorch, same weights and shapes.

Two models (a third on request), each with its PyTorch twin holding the
same weights:

* ``transformer_base``: the paper's base model (63M parameters, vocab 37000)
  against ``torch_reference.TorchTransformer`` (``nn.Transformer``), a
  batch of 8 x 64 source + 64 target tokens, dropout 0.1 (attention weights
  included, as ``nn.Transformer`` drops them), Adam;
* ``default_lm``: the default job's size (4 layers, d_model 128, 4 heads,
  byte vocabulary, 32 x 128 tokens) in the GPT-2 layout against Hugging
  Face's ``GPT2LMHeadModel``, dropout 0.1, AdamW;
* ``transformer_base_scan`` (not by default): the base model with its
  layers under ``lax.scan`` (``scan_layers=True``), the same twin.

Each first checks that both compute the same loss (dropout off), then times
the train step (forward, backward, optimizer update) and the eval forward
(logits and loss, no gradient) in interleaved rounds; compile time is
reported apart. Floating-point work is counted as 6 (train) or 2 (forward)
x parameters x tokens, logits included, plus attention's score and value
matmuls; the fraction of the machine's measured matmul rate says how close
each side gets to the floor.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from jax_transformer.bench import timing
from jax_transformer.interop import hf_families, torch_layouts
from jax_transformer.model.config import gpt2_small, transformer_base
from jax_transformer.model.families import family
from jax_transformer.model.params import split
from jax_transformer.train import model_setup, perf, steps

LR = 1e-4


def base_case(dropout: float = 0.1) -> dict[str, Any]:
  return dict(name='transformer_base',
              config=transformer_base(dropout_rate=dropout,
                                      attention_dropout_rate=dropout),
              kind='encoder_decoder', batch=8, src_len=64, tgt_len=64)


def base_scan_case(dropout: float = 0.1) -> dict[str, Any]:
  """The paper's base model with its layers under ``lax.scan``
  (``scan_layers``): one layer compiled instead of six a stack."""
  case = base_case(dropout)
  return dict(case, name='transformer_base_scan',
              config=dataclasses.replace(case['config'], scan_layers=True))


def lm_case(dropout: float = 0.1) -> dict[str, Any]:
  return dict(name='default_lm',
              config=gpt2_small(vocab_size=264, d_model=128, num_heads=4,
                                num_decoder_layers=4, d_ff=512, max_len=256,
                                activation='gelu', dropout_rate=dropout,
                                attention_dropout_rate=dropout),
              kind='decoder_lm', batch=32, src_len=0, tgt_len=128)


# The models ``--models`` may name.
CASES = {'transformer_base': base_case, 'default_lm': lm_case,
         'transformer_base_scan': base_scan_case}


def make_batch(case: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
  """One unpadded batch in the trainer's format (segment 1 everywhere)."""
  rs = np.random.RandomState(seed)
  b, s, t = case['batch'], case['src_len'], case['tgt_len']
  v = case['config'].vocab_size
  ids = lambda n: rs.randint(3, v, (b, n)).astype(np.int32)  # noqa: E731
  ones = lambda n: np.ones((b, n), np.int32)  # noqa: E731
  pos = lambda n: np.broadcast_to(np.arange(n, dtype=np.int32), (b, n))  # noqa: E731
  if s:
    tgt = ids(t + 1)
    return dict(src=ids(s), src_segment_ids=ones(s), src_positions=pos(s),
                tgt_in=tgt[:, :-1], tgt_out=tgt[:, 1:],
                tgt_segment_ids=ones(t), tgt_positions=pos(t))
  seq = ids(t + 1)
  return dict(inputs=seq[:, :-1], targets=seq[:, 1:], segment_ids=ones(t),
              positions=pos(t))


def optimizer(case) -> optax.GradientTransformation:
  if case['src_len']:
    return optax.adam(LR, b1=0.9, b2=0.98, eps=1e-9)
  return optax.adamw(LR, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0)


# ----------------------------------------------------------------------------
# JAX.


def jax_side(case: dict[str, Any], with_train: bool = True):
  """(model, compiled train step (None without with_train), compiled eval
  step, state, device batch, compile seconds of each)."""
  config = case['config']
  model = family(case['kind']).model_class(config, nnx.Rngs(0))
  model_def, params = split(model)
  tx = optimizer(case)
  state = model_setup.train_state(params, tx)
  batch = jax.device_put(make_batch(case))
  train = jax.jit(steps.make_train_step(model_def, tx), donate_argnums=0)
  evaluate = jax.jit(steps.make_eval_step(model_def))
  train_compile = None
  if with_train:
    train, train_compile = perf.compile_timed(train, state, batch)
  evaluate, eval_compile = perf.compile_timed(evaluate, params, batch)
  return model, train, evaluate, state, batch, train_compile, eval_compile


# ----------------------------------------------------------------------------
# PyTorch.


def torch_side(case: dict[str, Any], model):
  """The PyTorch twin holding ``model``'s weights, and its optimizer."""
  import torch  # optional (the test extra): only PyTorch paths need it
  state = torch_layouts.of_kind(case['kind']).to_torch(model)
  if family(case['kind']).has_source:
    # It imports torch, optional (the test extra).
    from jax_transformer.interop.torch_reference import TorchTransformer
    ref = TorchTransformer.from_config(case['config'])
    ref.load_state_dict({k: torch.from_numpy(np.array(v))
                         for k, v in state.items()})
    opt = torch.optim.Adam(ref.parameters(), lr=LR, betas=(0.9, 0.98),
                           eps=1e-9)
  else:
    import transformers  # optional (the test extra), heavy
    hf = transformers.GPT2Config(**hf_families.gpt2_hf_config(
        case['config']))
    hf._attn_implementation = 'sdpa'  # pylint: disable=protected-access
    ref = transformers.GPT2LMHeadModel(hf)
    ref.load_state_dict({k: torch.from_numpy(np.array(v))
                         for k, v in state.items()}, strict=False)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.0)
  return ref, opt


def torch_loss(ref, batch):
  """Mean token cross-entropy of the PyTorch twin on our batch."""
  import torch  # optional (the test extra): only PyTorch paths need it
  t = {k: torch.from_numpy(np.array(v)).long() for k, v in batch.items()}
  if 'src' in t:
    logits, targets = ref(t['src'], t['tgt_in']), t['tgt_out']
  else:
    logits, targets = ref(t['inputs']).logits, t['targets']
  return torch.nn.functional.cross_entropy(
      logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def torch_train_step(ref, opt, batch):
  ref.train()
  opt.zero_grad(set_to_none=True)
  loss = torch_loss(ref, batch)
  loss.backward()
  opt.step()
  return float(loss.detach())


def torch_eval_step(ref, batch):
  import torch  # optional (the test extra): only PyTorch paths need it
  ref.eval()
  with torch.inference_mode():
    return float(torch_loss(ref, batch))


# ----------------------------------------------------------------------------


def same_loss(case: dict[str, Any]) -> dict[str, float]:
  """Both sides' eval loss with dropout off, on the same weights and batch."""
  model, _, evaluate, state, batch, _, _ = jax_side(
      dict(case, config=case['config'].replace(dropout_rate=0.0,
                                               attention_dropout_rate=0.0)),
      with_train=False)
  sums = jax.device_get(evaluate(state['params'], batch))
  ours = float(sums['nll'] / sums['tokens'])
  ref, _ = torch_side(case, model)
  theirs = torch_eval_step(ref, make_batch(case))
  return {'loss_jax': ours, 'loss_torch': theirs,
          'loss_rel_diff': abs(ours - theirs) / abs(theirs)}


def run_case(case: dict[str, Any], rounds: int) -> list[dict[str, Any]]:
  """Rows for the train step and the eval forward of one model."""
  import torch  # optional (the test extra): only PyTorch paths need it
  check = same_loss(case)
  if check['loss_rel_diff'] > 1e-4:
    raise AssertionError(f'{case["name"]}: losses differ ({check}); the '
                         'timings would compare different computations.')
  model, train, evaluate, state, batch, train_compile, eval_compile = (
      jax_side(case))
  ref, opt = torch_side(case, model)
  host_batch = make_batch(case)
  holder = {'state': state}

  def jax_train():
    holder['state'], metrics = train(holder['state'], batch)
    jax.block_until_ready(metrics)

  flops = perf.step_flops(case['config'], case['batch'], case['src_len'],
                          case['tgt_len'])
  matmul = perf.matmul_rate()
  rows = []
  for kind, ours, theirs, work, compile_s in (
      ('train', jax_train, lambda: torch_train_step(ref, opt, host_batch),
       flops['train'], train_compile),
      ('forward',
       lambda: jax.block_until_ready(evaluate(holder['state']['params'],
                                              batch)),
       lambda: torch_eval_step(ref, host_batch), flops['forward'],
       eval_compile)):
    load = timing.load_average()
    times = timing.interleave({'jax': ours, 'torch': theirs}, rounds)
    row = dict(suite='cpu', model=case['name'], step=kind,
               batch=case['batch'], src_len=case['src_len'],
               tgt_len=case['tgt_len'], **timing.summary(times, 'jax',
                                                         'torch'),
               compile_s=compile_s, gflop=work / 1e9,
               matmul_gflop_s=matmul / 1e9, threads=torch.get_num_threads(),
               load_before=load, load_after=timing.load_average(), **check)
    row['jax_floor_fraction'] = work / matmul / row['jax_s']
    row['torch_floor_fraction'] = work / matmul / row['torch_s']
    rows.append(row)
  return rows


def run(rounds: int = 7, models: tuple[str, ...] = ('transformer_base',
                                                     'default_lm')):
  """Rows for every model named (see the module docstring)."""
  import torch  # optional (the test extra): only PyTorch paths need it
  torch.manual_seed(0)
  # XLA's CPU client uses every core this process may run on; so does torch.
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  return [row for name in models for row in run_case(CASES[name](), rounds)]
