"""The PyTorch reference model: ``nn.Transformer`` plus what it leaves out.

This is the seed's "library version": a shared ``nn.Embedding`` scaled by
sqrt(d_model) plus sinusoidal positions, ``nn.Transformer(batch_first=True)``
and an output ``nn.Linear`` tied to the embedding. Load parameters exported
by ``torch_compat.encoder_decoder_to_torch`` into it::

    ref = TorchTransformer.from_config(config)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})

Importing this module imports torch (install the ``test`` extra).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from jax_transformer.interop import torch_compat


def sinusoidal(n: int, d: int) -> torch.Tensor:
  """[n, d] positional encodings, sin on even and cos on odd dimensions."""
  pos = torch.arange(n).unsqueeze(1)
  angle = pos / 10000 ** (torch.arange(0, d, 2) / d)
  pe = torch.zeros(n, d)
  pe[:, 0::2], pe[:, 1::2] = angle.sin(), angle.cos()
  return pe


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
  return F.gelu(x, approximate='tanh')


class TorchTransformer(nn.Module):
  """embed -> nn.Transformer -> head, with PyTorch's mask convention."""

  def __init__(self, vocab_size: int, d_model: int = 512, nhead: int = 8,
               num_encoder_layers: int = 6, num_decoder_layers: int = 6,
               dim_feedforward: int = 2048, dropout: float = 0.1,
               activation: str = 'relu', norm_first: bool = False,
               layer_norm_eps: float = 1e-5, tie_embeddings: bool = True):
    super().__init__()
    self.d_model = d_model
    self.embed = nn.Embedding(vocab_size, d_model)
    self.transformer = nn.Transformer(
        d_model=d_model, nhead=nhead, num_encoder_layers=num_encoder_layers,
        num_decoder_layers=num_decoder_layers,
        dim_feedforward=dim_feedforward, dropout=dropout,
        activation=_gelu_tanh if activation == 'gelu_tanh' else activation,
        layer_norm_eps=layer_norm_eps, batch_first=True,
        norm_first=norm_first)
    self.head = nn.Linear(d_model, vocab_size, bias=False)
    if tie_embeddings:
      self.head.weight = self.embed.weight

  @classmethod
  def from_config(cls, config) -> 'TorchTransformer':
    """The reference twin of a ``jax_transformer.ModelConfig``."""
    return cls(**torch_compat.reference_kwargs(config))

  def encode_tokens(self, ids: torch.Tensor) -> torch.Tensor:
    """[batch, seq] -> [batch, seq, d_model]."""
    return (self.embed(ids) * math.sqrt(self.d_model)
            + sinusoidal(ids.size(1), self.d_model))

  def forward(self, src: torch.Tensor, tgt: torch.Tensor,
              src_key_padding_mask: torch.Tensor | None = None,
              tgt_key_padding_mask: torch.Tensor | None = None
              ) -> torch.Tensor:
    """Logits [batch, tgt_len, vocab]; padding masks are True where padded."""
    causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
    out = self.transformer(
        self.encode_tokens(src), self.encode_tokens(tgt), tgt_mask=causal,
        tgt_is_causal=True, src_key_padding_mask=src_key_padding_mask,
        tgt_key_padding_mask=tgt_key_padding_mask,
        memory_key_padding_mask=src_key_padding_mask)
    return self.head(out)
