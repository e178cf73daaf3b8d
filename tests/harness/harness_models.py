"""Tiny Hugging Face checkpoints for the harness tests: a GPT-2 (its
tokenizer adds no BOS) and a Llama 3 whose tokenizer adds BOS, as Llama's
do, both long enough (256 positions) for a generation task's 64 new
tokens."""

import torch
import transformers
from interop import hf_models
from tokenizers import processors

SHAPES = {
    'gpt2': lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=hf_models.VOCAB, n_positions=256, n_embd=32, n_layer=2,
        n_head=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    'llama3': lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=hf_models.VOCAB, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, rope_theta=500000.0, tie_word_embeddings=False)),
}
ADDS_BOS = {'gpt2': False, 'llama3': True}


def save(family: str, path: str, seed: int = 0) -> str:
  torch.manual_seed(seed)
  model = hf_models.randomize(SHAPES[family](), seed).eval()
  model.save_pretrained(path)
  tokenizer = hf_models.tokenizer()
  if ADDS_BOS[family]:
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single='<s> $A', pair='<s> $A <s> $B', special_tokens=[('<s>', 1)])
  tokenizer.save_pretrained(path)
  return str(path)
