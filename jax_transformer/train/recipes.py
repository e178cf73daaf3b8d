"""What experiment configs share: the base fields, the paper's recipe,
GPT-2 small's recipe and the scale-up helper.

Each file in ``configs/`` builds its ``ml_collections.ConfigDict`` from
these and imports nothing but ``jax_transformer``, so it loads by path from
any working directory. ``config.model``'s fields and their defaults come
from :class:`~jax_transformer.model.config.ModelConfig` (one home for each
default); a recipe names only what it changes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ml_collections import ConfigDict, config_dict

from jax_transformer.model.config import ModelConfig

# Fields that may stay unset in an experiment: vocab_size None means the
# tokenizer's; num_kv_heads None means num_heads.
_UNSET_BY_DEFAULT = {'vocab_size': int, 'num_kv_heads': int}


def optional(kind: type) -> config_dict.FieldReference:
  """A field that is None by default and still settable from the command
  line (``--config.data.data_dir=...``)."""
  return config_dict.placeholder(kind)


def model_fields(preset: Callable[..., ModelConfig] = ModelConfig,
                 **overrides) -> ConfigDict:
  """Every ModelConfig field, from ``preset(**overrides)``, as a ConfigDict.

  The values are checked now (a bad recipe fails when its config loads).
  ``vocab_size`` stays None (the tokenizer's) unless given.
  """
  values = dataclasses.asdict(preset(**overrides))
  for name, kind in _UNSET_BY_DEFAULT.items():
    if name not in overrides:
      values[name] = optional(kind)
  return ConfigDict(values)


def small_lm(**overrides) -> ModelConfig:
  """The default decoder-only LM: pre-norm, rotary positions, GELU, no
  biases, a tied head, dropout on residuals only."""
  fields = dict(d_model=128, num_heads=4, num_encoder_layers=0,
                num_decoder_layers=4, d_ff=512, attention_dropout_rate=0.0,
                activation='gelu', norm_first=True, positional='rotary',
                max_len=256, scale_embeddings=False, use_bias=False)
  return ModelConfig(**{**fields, **overrides})


def paper_model(**overrides) -> ConfigDict:
  """The paper's encoder-decoder (ModelConfig's defaults: post-norm, ReLU,
  sinusoidal positions, embeddings scaled by sqrt(d_model), biases)."""
  return model_fields(ModelConfig, **overrides)


def base_config() -> ConfigDict:
  """Fields every experiment has; experiment files override them."""
  c = ConfigDict()
  c.model_kind = 'decoder_lm'
  c.model = model_fields(small_lm)
  # Start from a pretrained model: a Hugging Face folder (or a model id in
  # its cache) or another workdir. Its model fields replace config.model's
  # and model_kind (train/pretrained.py); unset: a fresh model.
  c.init_from = optional(str)
  # LoRA on a pretrained model (docs/finetune.md): rank 0 is off; above 0,
  # only adapters on the kernels targets names train (patterns: 'query',
  # 'attention', 'mlp', 'layers.*.ff.wi'), scaled by alpha / rank, and only
  # they are in the optimizer and in checkpoints: the frozen base is read
  # from init_from at every start (model/lora.py).
  c.lora = ConfigDict(dict(rank=0, alpha=16.0,
                           targets='query,key,value,out'))
  c.vocab_multiple = 8
  c.data = ConfigDict(dict(
      name='shakespeare', data_dir=optional(str), direction=optional(str),
      pack=False, src_len=optional(int), tokenizer=optional(str),
      vocab_size=optional(int), spm_model_type='unigram',
      train_split='train', eval_split='validation',
      builder_kwargs=optional(dict),
      # A dataset outside data.DATASETS (docs/data.md, "Your own data"):
      # any TFDS name ('name/config:version') or 'files'; its task ('lm',
      # or 'translation' where direction is set), the LM's text feature
      # ('text'), 'stream' or 'examples' (datasets.DatasetSpec.lm_mode).
      task=optional(str), text_key=optional(str), lm_mode=optional(str),
      # name='files': globs (local or gs://) of .txt/.jsonl/.parquet/.tsv
      # (.gz/.zst); without eval_files the last eval_fraction of the
      # training documents is held out.
      train_files=optional(str), eval_files=optional(str),
      eval_fraction=optional(float),
      # name='huggingface:OWNER/NAME' (the Hub, or its cache offline):
      # hf_config its config; name='huggingface': hf_path a save_to_disk
      # folder (data/hf_datasets.py; pip install '.[hf]').
      hf_config=optional(str), hf_path=optional(str),
      # An existing tokenizer instead of one trained on the corpus: a
      # SentencePiece .model, a Hugging Face tokenizer.json or a folder
      # holding one (tokenizers.from_path); tokenizer and vocab_size unset.
      tokenizer_path=optional(str),
      # Several sources with weights, read with this data's tokenizer
      # (docs/data.md, "Mixtures"): a tuple of dicts such as
      # {'name': 'shakespeare', 'weight': 3}; unset: config.data alone.
      mixture=optional(tuple),
      # Processes tokenizing a big split when it is prepared (unset: all).
      prepare_workers=optional(int),
      # Processes building training batches (0: this process, with
      # threads), and batches each keeps ready. The count is part of the
      # stream: resume with the count a checkpoint was saved with.
      worker_count=0, worker_buffer_size=2))
  c.seq_len = 128
  c.batch_size = 32
  c.eval_batch_size = 32
  c.num_steps = 600
  c.log_every = 50
  c.eval_every = 200
  c.eval_steps = optional(int)  # unset: the whole validation split
  # Translation: greedy BLEU on this many validation sentences at each eval.
  c.eval_bleu_examples = 0
  c.checkpoint_every = 200
  # Peak FLOP/s of one device in TFLOP/s, for MFU in the logs; unset: built
  # in for H100/H200/A100/TPU v4-v6 (bf16 dense), no MFU on CPUs.
  c.peak_tflops = optional(float)
  # Memory of one device in GB (10^9 bytes): a run whose train step needs
  # more is refused before its first step. Unset: built in for H100/H200/
  # A100/TPU v4-v6 (vendor figures); on CPUs only reported, never refused.
  c.device_memory_gb = optional(float)
  # Tokens per chunk of the output head and loss (0: all at once). Chunked,
  # float32 logits [B, T, V] never exist in the step: set it (e.g. 4096)
  # when the vocabulary is large.
  c.loss_chunk_size = 0
  c.keep_checkpoints = 3
  # Seconds without a finished step (or evaluation batch, or save) after
  # which the run prints every thread's stack and exits with status 124
  # (runtime/stall.py). Unset: 20x the longest interval seen, at least
  # 600 s; 0: never. Compiling is not counted.
  c.step_timeout_s = optional(float)
  # A jax.profiler trace of steps start_step .. start_step + num_steps - 1
  # under WORKDIR/tensorboard/ (0 steps: none). A file named PROFILE in the
  # workdir asks a running trainer for one (train/profiling.py).
  c.profile = ConfigDict(dict(start_step=0, num_steps=0))
  c.seed = 0
  c.optim = ConfigDict(dict(
      optimizer='adamw', schedule='warmup_cosine', learning_rate=2e-3,
      warmup_steps=50, final_lr_fraction=0.1, lr_scale=1.0, b1=0.9, b2=0.98,
      eps=1e-9, weight_decay=0.1, clip_norm=1.0, grad_accum_steps=1,
      label_smoothing=0.0, z_loss=0.0,
      # Updates with a non-finite loss or gradient norm are skipped (params
      # and optimizer state kept); training stops at the first (0) or after
      # this many in a row.
      max_skipped_updates=0))
  # Devices as data x fsdp x tensor (one -1: the rest). Over several TPU
  # slices (GPU hosts) only data and fsdp cross the slow network between
  # them: dcn_data x dcn_fsdp parts of those axes, one per slice (host);
  # both 0 puts data across first, then fsdp (model/sharding.make_mesh).
  c.mesh = ConfigDict(dict(data=-1, fsdp=1, tensor=1, dcn_data=0,
                           dcn_fsdp=0))
  c.sample = ConfigDict(dict(enabled=True, prompt='ROMEO:', max_new_tokens=200,
                             temperature=0.8, top_k=40))
  return c


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
  # 4 for 1M tokens (lm_1_3b on v6e-256: 59% -> 62% MFU bound against 8
  # chunks); a batch of at most this many tokens is one chunk.
  c.loss_chunk_size = 262144
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  return c
