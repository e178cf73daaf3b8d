"""Tiny random Hugging Face models of each family, made by transformers
itself and saved with save_pretrained, with a byte-level BPE tokenizer
trained offline by the tokenizers library."""

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jax_transformer.data import testing as data_testing

VOCAB = 300
SPECIALS = ['<pad>', '<s>', '</s>', '<unk>']

# Grouped-query attention everywhere (4 query heads, 2 key/value heads).
_SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
              num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
LLAMA3_ROPE = {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0,
               'high_freq_factor': 4.0,
               'original_max_position_embeddings': 64}

FAMILIES = {
    # Llama 3: RoPE scaling (every branch of it at head width 8), theta
    # 500000, untied head.
    'llama3': lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **_SHAPE, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
        rms_norm_eps=1e-5, tie_word_embeddings=False)),
    # Llama 2: plain RoPE, and biases on q, k, v and o (attention_bias).
    'llama2': lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **_SHAPE, rms_norm_eps=1e-6, attention_bias=True)),
    'mistral': lambda: transformers.MistralForCausalLM(
        transformers.MistralConfig(**_SHAPE, sliding_window=None,
                                   rope_theta=1e6)),
    # Qwen2: biases on q, k and v only; a tied head.
    'qwen2': lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **_SHAPE, tie_word_embeddings=True)),
    'gpt2': lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)),
}


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
  """Non-trivial weights: norm scales 1 + noise, the rest noise."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      noise = 0.2 * torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + noise if 'norm' in name or '.ln_' in name else noise)
  return module


def tokenizer() -> transformers.PreTrainedTokenizerFast:
  backend = Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  backend.train_from_iterator(
      [data_testing.fake_play(p) for p in ('macbeth', 'lear')],
      trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, pad_token='<pad>', bos_token='<s>',
      eos_token='</s>', unk_token='<unk>')


def save(family: str, path: str, seed: int = 0, **save_kwargs):
  """The tiny model of ``family`` and its tokenizer saved in ``path``;
  returns the torch model (eval mode, float32)."""
  torch.manual_seed(seed)
  model = randomize(FAMILIES[family](), seed).eval()
  model.save_pretrained(path, **save_kwargs)
  tokenizer().save_pretrained(path)
  return model


def torch_logits(model, ids: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(ids).long()).logits.float(
        ).numpy()


def random_ids(batch: int = 2, length: int = 48, seed: int = 0) -> np.ndarray:
  return np.random.RandomState(seed).randint(0, VOCAB, (batch, length)
                                             ).astype(np.int32)
