"""Fine-tuning a pretrained model (docs/finetune.md).

Every preset starts from ``config.init_from`` (a Hugging Face folder, a
model id in its cache, or a workdir): the model fields and the tokenizer
come from there. Fine-tuning settings: AdamW without weight decay, a low
learning rate after a short warmup, a few hundred steps, no dropout. Full
fine-tuning by default; LoRA with ``--config.lora.rank=8`` (adapters alone
train, at a higher learning rate: ``--config.optim.learning_rate=1e-3``).

Presets:
  gpt2_shakespeare  (also the default) GPT-2 (init_from=runs/gpt2_hf) on the
                    offline plays, a constant learning rate of 1e-4 after
                    10 warmup steps
  llama_instruct    a Llama-family model (init_from=runs/llama_hf) on your
                    instruction data, JSON lines of prompt/completion or
                    chat messages (--config.data.files.train=...), trained on
                    the completions only; cosine from 5e-5
  tiny              llama_instruct's settings in seconds (tests)
"""

from ml_collections import ConfigDict

from jax_transformer.train.recipes import base_config, model_fields, small_lm


def finetuning(c: ConfigDict, *, learning_rate: float, schedule: str,
               warmup_steps: int, num_steps: int) -> ConfigDict:
  """The settings every preset shares."""
  c.model.update(dropout_rate=0.0, attention_dropout_rate=0.0)
  c.optim.update(optimizer='adamw', schedule=schedule,
                 learning_rate=learning_rate, warmup_steps=warmup_steps,
                 final_lr_fraction=0.1, b1=0.9, b2=0.999, eps=1e-8,
                 weight_decay=0.0, clip_norm=1.0)
  c.num_steps = num_steps
  c.log_every = 10
  c.eval_every = c.checkpoint_every = max(num_steps // 4, 1)
  c.eval_steps = 10
  c.keep_checkpoints = 2
  c.lora.update(rank=0, alpha=16.0, targets='query,key,value,out',
                dropout=0.0)
  return c


def get_config(preset: str | None = None) -> ConfigDict:
  c = base_config()
  if preset in (None, 'gpt2_shakespeare'):
    # GPT-2 small's shape (the checkpoint's fields replace it).
    c.model = model_fields(
        small_lm, d_model=768, num_heads=12, num_decoder_layers=12,
        d_ff=3072, activation='gelu_tanh', positional='learned',
        max_len=1024, use_bias=True)
    c.init_from = 'runs/gpt2_hf'
    c.data.update(name='shakespeare', pack=False)
    c.seq_len = 256
    c.batch_size = c.eval_batch_size = 8
    finetuning(c, learning_rate=1e-4, schedule='constant', warmup_steps=10,
               num_steps=200)
    c.sample.prompt = 'ROMEO:'
  elif preset in ('llama_instruct', 'tiny'):
    c.model = model_fields(
        small_lm, activation='swiglu', norm='rmsnorm', positional='rotary',
        tie_embeddings=False, num_kv_heads=2, layer_norm_eps=1e-5,
        max_len=2048)
    c.init_from = 'runs/llama_hf'
    # JSON lines of {"prompt", "completion"} or {"messages": [...]}
    # (data/files.py): rows of prompt + completion, loss on the completion.
    c.data.update(name='files', direction='prompt-completion',
                  lm_mode='examples', pack=False)
    c.data.files.eval_fraction = 0.05
    c.seq_len = 512
    c.batch_size = c.eval_batch_size = 8
    finetuning(c, learning_rate=5e-5, schedule='warmup_cosine',
               warmup_steps=10, num_steps=300)
    c.sample.update(prompt='<|user|>\nWho is Romeo?\n<|assistant|>\n',
                    temperature=0.7, max_new_tokens=64)
    if preset == 'tiny':
      c.seq_len = 64
      c.num_steps = 4
      c.eval_every = c.checkpoint_every = 2
      c.eval_steps = 1
      c.log_every = 1
      c.sample.enabled = False
  else:
    raise ValueError(f'Unknown preset {preset!r}; choose gpt2_shakespeare, '
                     'llama_instruct or tiny.')
  return c
