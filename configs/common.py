"""Fields every experiment config has; experiment files override them."""

from ml_collections import ConfigDict, config_dict


def optional(kind):
  """A field that is None by default and still settable from the command line."""
  return config_dict.placeholder(kind)


def model_fields(**overrides) -> ConfigDict:
  """Every ModelConfig field; vocab_size None = the tokenizer's."""
  fields = dict(
      vocab_size=optional(int), d_model=128, num_heads=4,
      num_kv_heads=optional(int),
      num_encoder_layers=0, num_decoder_layers=4, d_ff=512,
      dropout_rate=0.1, attention_dropout_rate=0.0, activation='gelu',
      norm_first=True, norm='layernorm', final_norm=True,
      positional='rotary', max_len=256, rope_base=10000.0,
      tie_embeddings=True, scale_embeddings=False, use_bias=False,
      layer_norm_eps=1e-5, dtype='float32', param_dtype='float32',
      attention_implementation='auto', dropout_rng='hash',
      scan_layers=False, remat='none')
  fields.update(overrides)
  return ConfigDict(fields)


def base_config() -> ConfigDict:
  """Fields every experiment has; experiment files override them."""
  c = ConfigDict()
  c.model_kind = 'decoder_lm'
  c.model = model_fields()
  c.vocab_multiple = 8
  c.data = ConfigDict(dict(
      name='shakespeare', data_dir=optional(str), direction=optional(str),
      pack=False, src_len=optional(int), tokenizer=optional(str),
      vocab_size=optional(int), spm_model_type='unigram',
      train_split='train', eval_split='validation',
      builder_kwargs=optional(dict)))
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
  c.mesh = ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  c.sample = ConfigDict(dict(enabled=True, prompt='ROMEO:', max_new_tokens=200,
                             temperature=0.8, top_k=40))
  return c


def paper_model(**overrides) -> ConfigDict:
  """The paper's encoder-decoder wiring: post-norm, ReLU, sinusoidal
  positions, embeddings scaled by sqrt(d_model), biases (nn.Transformer)."""
  fields = dict(activation='relu', norm_first=False, positional='sinusoidal',
                scale_embeddings=True, use_bias=True)
  return model_fields(**{**fields, **overrides})


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
