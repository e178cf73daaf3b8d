"""Run by test_parity_at_default_flags.py in a process of its own, with
whatever XLA_FLAGS the test gives it (none: XLA's defaults, as users run):
the parity comparisons against PyTorch and transformers, and a tiny LM's
forward and three train steps saved for comparison between two such
processes.

    python numerics_at_flags.py OUT_DIR

writes OUT_DIR/result.json (each comparison's largest difference and
largest logit, the flags and precision in force) and OUT_DIR/lm.npz
(the tiny LM's logits, and its parameters before and after three
steps).
"""

import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx
from hf_models import random_ids, save, torch_logits
from jax.sharding import NamedSharding
from torch_helpers import randomize

import jax_transformer as jt
from jax_transformer.experiment import doors
from jax_transformer.interop import torch_compat
from jax_transformer.interop.torch_reference import TorchTransformer
from jax_transformer.model import params as params_lib
from jax_transformer.model import sharding
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM
from jax_transformer.model.params import split
from jax_transformer.train import init_from, model_setup
from jax_transformer.train import steps as steps_lib

# The encoder-decoder as tests/interop/test_torch_parity.py builds it.
ENCODER_DECODER = jt.ModelConfig(
    vocab_size=61, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2,
    num_decoder_layers=2, norm_first=True, activation='gelu')


def encoder_decoder() -> dict:
  """PyTorch's nn.Transformer (torch_reference) and the model it converts
  to, on a padded batch: logits at the real target positions."""
  ref = randomize(TorchTransformer.from_config(ENCODER_DECODER), 0).eval()
  model = torch_compat.encoder_decoder_from_torch(ref.state_dict(),
                                                  ENCODER_DECODER)
  rs = np.random.RandomState(0)
  src, tgt = rs.randint(3, 61, (3, 9)), rs.randint(3, 61, (3, 6))
  src_real, tgt_real = np.ones((3, 9), bool), np.ones((3, 6), bool)
  src_real[1, 6:] = src_real[2, 4:] = False
  tgt_real[1, 4:] = tgt_real[2, 2:] = False
  src[~src_real] = tgt[~tgt_real] = 0
  with torch.no_grad():
    want = ref(*(torch.from_numpy(a) for a in (src, tgt, ~src_real,
                                                ~tgt_real))).numpy()
  got = np.asarray(jax.jit(lambda *a: model(*a))(
      jnp.asarray(src), jnp.asarray(tgt), jnp.asarray(src_real),
      jnp.asarray(tgt_real)))
  return compared(got[tgt_real], want[tgt_real])


def hugging_face(family: str, folder: str) -> dict:
  """A tiny random model of ``family`` made and saved by transformers,
  imported as a user imports it (config.init_from's source), on this
  process's one device: logits of the same ids."""
  model = save(family, os.path.join(folder, family), seed=3)
  source = init_from.open_source(os.path.join(folder, family))
  config = ModelConfig(**source.fields, dropout_rate=0.0,
                       attention_dropout_rate=0.0,
                       attention_implementation=None)
  mesh = sharding.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 1})
  model_def, _ = params_lib.abstract(lambda: DecoderLM(config))
  specs = sharding.param_specs(model_def.logical_axes)
  params = source.place(config, {k: NamedSharding(mesh, s)
                                 for k, s in specs.items()})
  ids = random_ids()
  got = np.asarray(jax.jit(lambda p, x: model_def.merge(p)(x))(params, ids))
  return compared(got, torch_logits(model, ids))


def compared(got: np.ndarray, want: np.ndarray) -> dict:
  return {'max_abs_diff': float(np.abs(got - want).max()),
          'max_abs_logit': float(np.abs(want).max())}


def tiny_lm() -> dict[str, np.ndarray]:
  """lm_shakespeare:tiny's model (dropout off, a 96-token vocabulary): its
  logits of a batch, and its parameters before and after three AdamW
  steps on it."""
  config = doors.load('lm_shakespeare:tiny').model_config(96).replace(
      dropout_rate=0.0)
  model_def, params = split(DecoderLM(config, nnx.Rngs(0)))
  rs = np.random.RandomState(0)
  seq = rs.randint(3, 96, (4, 33)).astype(np.int32)
  ones = np.ones((4, 32), np.int32)
  batch = dict(inputs=seq[:, :-1], targets=seq[:, 1:], segment_ids=ones,
               positions=np.broadcast_to(np.arange(32, dtype=np.int32),
                                         (4, 32)))
  logits = jax.jit(lambda p, x: model_def.merge(p)(x))(params, batch['inputs'])
  out = {'logits': np.asarray(logits)}
  out.update({f'initial/{k}': np.asarray(v) for k, v in params.items()})
  tx = optax.adamw(1e-3)
  state = model_setup.train_state(params, tx)
  step = jax.jit(steps_lib.make_train_step(model_def, tx))
  for _ in range(3):
    state, _ = step(state, batch)
  out.update({f'param/{k}': np.asarray(v)
              for k, v in state['params'].items()})
  return out


def main(out_dir: str) -> None:
  with tempfile.TemporaryDirectory() as folder:
    result = {'xla_flags': os.environ.get('XLA_FLAGS'),
              'matmul_precision': jax.config.jax_default_matmul_precision,
              'devices': jax.device_count(),
              'encoder_decoder': encoder_decoder(),
              'llama3': hugging_face('llama3', folder),
              'gpt2': hugging_face('gpt2', folder)}
  np.savez(os.path.join(out_dir, 'lm.npz'), **tiny_lm())
  with open(os.path.join(out_dir, 'result.json'), 'w') as f:
    json.dump(result, f)


if __name__ == '__main__':
  main(sys.argv[1])
