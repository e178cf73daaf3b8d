"""Shared helpers for the PyTorch parity tests."""

import numpy as np
import torch
from flax import nnx

from jax_transformer.interop import torch_compat


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
  """Non-trivial weights everywhere: norm scales 1 + noise, the rest noise."""
  gen = torch.Generator().manual_seed(seed)
  norms = {id(m.weight) for m in module.modules()
           if isinstance(m, torch.nn.LayerNorm)}
  with torch.no_grad():
    for p in module.parameters():
      noise = 0.2 * torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + noise if id(p) in norms else noise)
  return module


class Holder(nnx.Module):
  """Puts a module under attribute ``part`` so entry paths have a prefix."""

  def __init__(self, part: nnx.Module):
    self.part = part


def load_module(torch_module, build, entries_fn):
  """A JAX module with torch_module's weights; entries use prefix 'part'."""
  sd = {f'part.{k}': v for k, v in torch_module.state_dict().items()}
  return torch_compat.import_state_dict(
      sd, lambda: Holder(build()), entries_fn('part', 'part')).part


def t(x) -> torch.Tensor:
  return torch.from_numpy(np.array(x))


def n(x) -> np.ndarray:
  return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
