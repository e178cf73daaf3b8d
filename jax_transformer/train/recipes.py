"""What experiment configs share: the base fields, the paper's recipe,
GPT-2 small's recipe, the scale-up helper, and the recipe's sample prompt
on other data.

Each file in ``configs/`` builds its ``ml_collections.ConfigDict`` from
these and imports nothing but ``jax_transformer``, so it loads by path from
any working directory. Every field and its default comes from the typed
experiment (``jax_transformer/experiment/``: one home for each default);
a recipe names only what it changes.
"""

from __future__ import annotations

from typing import Callable

from ml_collections import ConfigDict

from jax_transformer import fields
from jax_transformer.experiment import base_config
from jax_transformer.model.config import ModelConfig, small_lm


def model_fields(preset: Callable[..., ModelConfig] = ModelConfig,
                 **overrides) -> ConfigDict:
  """Every ModelConfig field, from ``preset(**overrides)``, as a ConfigDict.

  The values are checked now (a bad recipe fails when its config loads).
  ``vocab_size`` stays unset (the tokenizer's) unless given.
  """
  overrides.setdefault('vocab_size', None)
  return fields.to_config_dict(preset(**overrides))


def paper_model(**overrides) -> ConfigDict:
  """The paper's encoder-decoder (ModelConfig's defaults: post-norm, ReLU,
  sinusoidal positions, embeddings scaled by sqrt(d_model), biases)."""
  return model_fields(ModelConfig, **overrides)


def paper_translation(c: ConfigDict, warmup_steps: int) -> ConfigDict:
  """The paper's training recipe on an encoder-decoder config: Adam(0.9,
  0.98, 1e-9), the inverse-square-root schedule, label smoothing 0.1."""
  c.model_kind = 'encoder_decoder'
  c.optim.update(optimizer='adam', schedule='rsqrt',
                 warmup_steps=warmup_steps, lr_scale=1.0, b1=0.9, b2=0.98,
                 eps=1e-9, weight_decay=0.0, clip_norm=0.0,
                 label_smoothing=0.1)
  c.sample.temperature = 0.0
  c.eval_bleu_examples = 256
  return c


def gpt2_recipe(preset: str | None = None) -> ConfigDict:
  """GPT-2 small on lm1b (``configs/gpt2_small.py``); preset 'shakespeare'
  puts the same model on the offline plays, byte-level."""
  c = base_config()
  c.model = model_fields(
      small_lm, d_model=768, num_heads=12, num_decoder_layers=12, d_ff=3072,
      dropout_rate=0.1, attention_dropout_rate=0.0, activation='gelu_tanh',
      positional='learned', max_len=1024, use_bias=True, dtype='bfloat16')
  c.vocab_multiple = 128
  c.data.update(name='lm1b', tokenizer='sentencepiece', vocab_size=32768,
                pack=True, eval_split='test')
  c.seq_len = 1024
  c.batch_size = c.eval_batch_size = 64
  c.num_steps = 100_000
  c.log_every = 100
  c.eval_every = 5000
  c.checkpoint_every = 2000
  c.optim.update(optimizer='adamw', schedule='warmup_cosine',
                 learning_rate=6e-4, warmup_steps=2000, b1=0.9, b2=0.95,
                 eps=1e-8, weight_decay=0.1, clip_norm=1.0)
  c.sample.prompt = 'The'
  if preset == 'shakespeare':
    c.data.update(name='shakespeare', tokenizer=None, vocab_size=None,
                  pack=False, eval_split='validation')
    c.seq_len = 256
    c.batch_size = c.eval_batch_size = 16
    c.num_steps = 5000
    c.sample.prompt = 'ROMEO:'
  elif preset:
    raise ValueError(f'Unknown preset {preset!r}; choose shakespeare or '
                     'none.')
  return c


def scale_up(c: ConfigDict, **model) -> ConfigDict:
  """A recipe at another size, with the options that make a large model
  fit and compile (docs/scaling.md): scanned layers, remat of all but
  matmul outputs, no dropout, a chunked loss and FSDP over all devices."""
  c.model.update(**model, scan_layers=True, remat='dots', dropout_rate=0.0)
  # Chunks take rows from across the batch: on 256 batch shards 1024 rows
  # each (float32 logits of 128 MiB a chip at V=32768). Each chunk reads
  # the head and writes its float32 gradient slot again, so few chunks:
  # 4 for 1M tokens (lm_1_3b on v6e-256: predicted MFU, cost version 8,
  # 59% -> 62% against 8 chunks); a batch of at most this many tokens is
  # one chunk.
  c.loss_chunk_size = 262144
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  return c


def prompt_for_own_data(config: ConfigDict, given: set[str],
                        recipe: Callable[[], ConfigDict]) -> None:
  """Empties ``config.sample.prompt`` (the sample then starts from a
  validation document, ``train.evaluating.data_prompt``) where ``given``,
  the fields set on the command line, holds ``data.name`` naming other
  data than ``recipe()`` (the recipe's ConfigDict) and not
  ``sample.prompt``: the recipe's prompt ('ROMEO:') is its data's."""
  if 'data.name' not in given or 'sample.prompt' in given:
    return
  if config.data.name != recipe().data.name:
    config.sample.prompt = ''
