"""The PyTorch layouts a model family exports to and imports from, by the
name its record gives (``model.families.Family.torch_layout``).

A layout is the four functions of one PyTorch twin: our model to its
state_dict, back, the name/shape table both check against, and the
twin's constructor arguments. They live here, above ``model/``, because
they import PyTorch-side tables; the family record names its layout
rather than holding these functions, so the model room never imports
this layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
from flax import nnx

from jax_transformer.errors import UsageError
from jax_transformer.interop import hf_families, torch_compat
from jax_transformer.model import families
from jax_transformer.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Layout:
  """One PyTorch twin's form of a model family's parameters.

  name: what export sidecars record ('reference', 'gpt2').
  to_torch: model -> {PyTorch name: array} (numpy).
  from_torch: (state_dict, ModelConfig) -> model.
  entries: ModelConfig -> the name/shape table (ValueError for a config
    the twin cannot hold).
  torch_config: (ModelConfig, tokenizer) -> the twin's constructor
    arguments, as an export's sidecar records them.
  """
  name: str
  to_torch: Callable[[nnx.Module], dict[str, np.ndarray]]
  from_torch: Callable[[Any, ModelConfig], nnx.Module]
  entries: Callable[[ModelConfig], list]
  torch_config: Callable[[ModelConfig, Any], dict[str, Any]]


def _reference_config(c: ModelConfig, tokenizer) -> dict[str, Any]:
  del tokenizer  # nn.Transformer takes no special ids
  return torch_compat.reference_kwargs(c)


def _gpt2_config(c: ModelConfig, tokenizer) -> dict[str, Any]:
  return hf_families.gpt2_hf_config(c, bos_id=tokenizer.bos_id,
                                    eos_id=tokenizer.eos_id,
                                    pad_id=tokenizer.pad_id)


LAYOUTS = {layout.name: layout for layout in (
    # The paper's model as torch_reference.TorchTransformer.
    Layout('reference', torch_compat.encoder_decoder_to_torch,
           torch_compat.encoder_decoder_from_torch,
           torch_compat.encoder_decoder_entries, _reference_config),
    # A GPT-2-shaped decoder LM as transformers.GPT2LMHeadModel.
    Layout('gpt2', torch_compat.decoder_lm_to_gpt2,
           torch_compat.decoder_lm_from_gpt2, torch_compat.gpt2_entries,
           _gpt2_config),
)}


def of_kind(kind: str) -> Layout:
  """The layout of the family ``kind``; UsageError for an unknown kind or
  a family without a PyTorch layout."""
  name = families.family(kind).torch_layout
  if name is None:
    raise UsageError(f'A {kind} model has no PyTorch layout; export it as '
                     '--format safetensors.')
  return LAYOUTS[name]


def kind_of(name: str) -> str:
  """The model kind whose family exports to the layout ``name``."""
  return next(f.kind for f in families.FAMILIES.values()
              if f.torch_layout == name)
