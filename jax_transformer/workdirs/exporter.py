"""A trained workdir's parameters as PyTorch, Hugging Face or safetensors
files, and a check of such a file against the JAX model.

Formats (``write(trained, fmt, out)``):

  torch        ``OUT``: a ``torch.save``'d state_dict of the reference
               encoder-decoder (``torch_reference.TorchTransformer``) or of
               ``transformers.GPT2LMHeadModel`` (a GPT-2-shaped decoder LM);
               ``OUT``'s stem + ``.json``: the layout, model kind, step, our
               ``ModelConfig`` and the PyTorch constructor's arguments
               (``torch_config``).
  hf           ``OUT/``: a Hugging Face folder that
               ``AutoModelForCausalLM.from_pretrained(OUT)`` loads, as GPT-2
               (learned positions), Qwen2 (q/k/v biases alone) or Llama
               (``hf_export``, ``interop/hf_families.py``): ``config.json``,
               ``model.safetensors`` or shards above 5 GB with their index,
               written tensor by tensor, plus ``tokenizer.json`` +
               ``tokenizer_config.json`` when the tokenizer has a
               ``transformers`` form (bytes and imported Hugging Face
               tokenizers do, SentencePiece does not here).
  safetensors  ``OUT``: the flat parameter dict under its dotted names (the
               keys of ``params.split``), with ``format``, ``model_kind``,
               ``model_config`` (JSON) and ``step`` in the file's metadata.

``torch`` and ``safetensors`` also save the tokenizer to ``OUT``'s stem +
``.tokenizer/`` (``Tokenizer.save``), where ``import_params`` finds it.

``verify`` loads an export with PyTorch (``torch``, ``hf``) or reads the
safetensors file back on its own (metadata config + tensors into a fresh JAX
model) and returns the largest absolute logit difference to the workdir's
model on a few validation batches (random in-vocab ids when the data is not
available). Both sides run in float32 at full matmul precision.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from jax_transformer import data
from jax_transformer.errors import UsageError
from jax_transformer.interop import (
  hf_export,
  hf_families,
  torch_compat,
  torch_layouts,
)
from jax_transformer.model import lora
from jax_transformer.model import params as params_lib
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.families import family
from jax_transformer.runtime import storage
from jax_transformer.workdirs import restore
from jax_transformer.workdirs.restore import Trained

FORMATS = ('torch', 'hf', 'safetensors')
TORCH_FORMAT = 'jax_transformer.torch'
SAFETENSORS_FORMAT = 'jax_transformer'
HF_CONFIG, HF_WEIGHTS = hf_families.HF_CONFIG, hf_families.HF_WEIGHTS
CONFIG_SUFFIX, TOKENIZER_SUFFIX = '.json', '.tokenizer'
TOLERANCE = 1e-4


class VerificationError(RuntimeError):
  """An export whose logits differ from the JAX model's beyond tolerance."""


def sidecar(out: str, suffix: str) -> str:
  """The path beside ``out`` with its extension replaced by ``suffix``."""
  return os.path.splitext(out)[0] + suffix


def model_config_json(c: ModelConfig) -> str:
  return json.dumps(dataclasses.asdict(c), sort_keys=True)


def build(kind: str, config: ModelConfig) -> Callable[[], nnx.Module]:
  """A builder of the model class of ``kind`` (to trace, not to run)."""
  return lambda: family(kind).model_class(config, nnx.Rngs(0))


def check_fits(trained: Trained, fmt: str) -> None:
  """Raises UsageError when ``fmt`` cannot hold the model (nothing written)."""
  if fmt not in FORMATS:
    raise UsageError(f'--format must be one of {FORMATS}, got {fmt!r}.')
  if fmt == 'hf' and trained.family.has_source:
    raise UsageError('--format hf writes a decoder-only causal LM (GPT-2, '
                     'Llama, Mistral, Qwen2); export an encoder-decoder as '
                     '--format torch or safetensors.')
  if fmt == 'hf':
    hf_export.check_fits(trained.model.config)
  if fmt == 'torch':
    try:
      torch_layouts.of_kind(trained.kind).entries(trained.model.config)
    except ValueError as e:
      raise UsageError(str(e)) from None


def write(trained: Trained, fmt: str, out: str) -> list[str]:
  """Writes the export; returns notes to print (one line each)."""
  check_fits(trained, fmt)
  if fmt != 'hf' and sidecar(out, CONFIG_SUFFIX) == out:
    raise UsageError(f'--out {out} would be overwritten by its own '
                     f'{CONFIG_SUFFIX} file; name it e.g. model.pt.')
  folder = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(folder):
    raise UsageError(f'--out {out}: the folder {folder} does not exist.')
  # hf streams the parameters itself, a layer at a time (hf_export), and
  # writes its folder whole or not at all.
  if fmt == 'hf':
    return _write_hf(trained, out)
  trained = on_host(trained)
  # OUT, its .json and .tokenizer/ are written aside and moved into place
  # together at the end: a failure leaves the folder as it was.
  with storage.written_whole(folder) as partial:
    notes = _WRITERS[fmt](trained, os.path.join(partial,
                                                os.path.basename(out)))
  return notes


def write_lora_adapter(workdir: str, step: int | None, out: str
                       ) -> tuple[int, list[str]]:
  """A LoRA run's adapters alone as a PEFT folder (``hf_export.
  write_adapter``): (the step written, notes). UsageError for a run
  without adapters or a model the Hugging Face layouts cannot hold."""
  opened, params, step = restore.load(workdir, step)
  model_def = opened.setup.model_def
  if not isinstance(model_def, lora.LoraModelDef):
    raise UsageError(f'--lora_adapter_only: {workdir} was not trained with '
                     'LoRA (config.lora.rank=0); export it whole.')
  if family(opened.config.model_kind).has_source:
    raise UsageError('--lora_adapter_only writes a PEFT adapter of a '
                     'decoder-only causal LM.')
  notes = hf_export.write_adapter(opened.setup.model_config, params,
                                  model_def, out,
                                  base_model=opened.config.init_from)
  return step, notes


def on_host(trained: Trained) -> Trained:
  """trained with its parameters gathered into host memory (numpy), one at
  a time: a model sharded over several devices (``restore.inference_mesh``)
  is written without a second copy on any device, and the layout
  conversions (slicing scanned stacks, transposes) run on the host."""
  model_def, params = params_lib.split(trained.model)
  host = {k: np.asarray(jax.device_get(v)) for k, v in params.items()}
  return dataclasses.replace(trained, model=model_def.merge(host))


def _tensors(arrays: dict[str, Any]) -> dict[str, np.ndarray]:
  # Contiguous, writable host arrays (torch and safetensors want both),
  # copied only where a view is neither.
  return {k: np.require(np.asarray(v), requirements=('C', 'W'))
          for k, v in arrays.items()}


def torch_config(trained: Trained) -> dict[str, Any]:
  """The PyTorch constructor's arguments: TorchTransformer(**d) or
  GPT2LMHeadModel(GPT2Config(**d)), as the family's layout gives them."""
  return torch_layouts.of_kind(trained.kind).torch_config(
      trained.model.config, trained.tokenizer)


def _write_torch(trained: Trained, out: str) -> list[str]:
  import torch  # optional (the test extra): only PyTorch paths need it
  layout = torch_layouts.of_kind(trained.kind)
  state_dict = _tensors(layout.to_torch(trained.model))
  torch.save({k: torch.from_numpy(v) for k, v in state_dict.items()}, out)
  meta = {'format': TORCH_FORMAT, 'layout': layout.name,
          'model_kind': trained.kind, 'step': trained.step,
          'model_config': dataclasses.asdict(trained.model.config),
          'torch_config': torch_config(trained)}
  with open(sidecar(out, CONFIG_SUFFIX), 'w') as f:
    json.dump(meta, f, indent=2, sort_keys=True)
  trained.tokenizer.save(sidecar(out, TOKENIZER_SUFFIX))
  return []


def _write_hf(trained: Trained, out: str) -> list[str]:
  # The tokenizer puts BOS first where training rows began with it (all
  # but a stream LM's windows), as generate.py does.
  return hf_export.write_folder(trained.model.config,
                                params_lib.split(trained.model)[1],
                                trained.tokenizer, out,
                                add_bos=not trained.stream)


def _write_safetensors(trained: Trained, out: str) -> list[str]:
  # Layers one by one whatever the training layout: the file reads the same.
  flat = _tensors(params_lib.unrolled(params_lib.split(trained.model)[1]))
  save_file(flat, out, metadata={
      'format': SAFETENSORS_FORMAT, 'model_kind': trained.kind,
      'model_config': model_config_json(trained.model.config),
      'step': str(trained.step)})
  trained.tokenizer.save(sidecar(out, TOKENIZER_SUFFIX))
  return []


_WRITERS = {'torch': _write_torch, 'hf': _write_hf,
            'safetensors': _write_safetensors}


# ----------------------------------------------------------------------------
# Reading our files back.


def read_safetensors(path: str) -> tuple[dict[str, np.ndarray],
                                         dict[str, str]]:
  """(tensors, metadata) of a safetensors file, as numpy."""
  with safe_open(path, framework='np') as f:
    return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def model_from_safetensors(path: str) -> nnx.Module:
  """The model an export --format safetensors describes, from the file
  alone."""
  flat, meta = read_safetensors(path)
  if meta.get('format') != SAFETENSORS_FORMAT:
    raise UsageError(f'{path} has no {SAFETENSORS_FORMAT} metadata: not '
                     'written by export --format safetensors.')
  config = ModelConfig(**json.loads(meta['model_config']))
  return torch_compat.module_from_flat(flat, build(meta['model_kind'],
                                                   config),
                                       config.params_dtype)


# ----------------------------------------------------------------------------
# Verification.


@dataclasses.dataclass(frozen=True)
class Verification:
  max_diff: float
  inputs: str  # what the logits were compared on, for the report

  def __str__(self) -> str:
    return (f'Largest absolute logit difference on {self.inputs}: '
            f'{self.max_diff:.3g}.')


def verification_batches(trained: Trained, num_batches: int = 2,
                         batch_size: int = 4
                         ) -> tuple[list[dict[str, np.ndarray]], str, str]:
  """(batches, description, note): a few validation batches of the
  workdir's data (rows without tokens dropped), or random in-vocab ids
  when the data is not available (then ``note`` says why)."""
  cfg = trained.config
  try:
    it = data.make_iterator(cfg.data, cfg.data.eval_split, trained.tokenizer,
                            batch_size=batch_size, seq_len=cfg.seq_len,
                            shuffle=False, num_epochs=1, process_index=0,
                            process_count=1)
    batches = [b for b in (_model_inputs(trained.kind, next(it, None))
                           for _ in range(num_batches)) if b]
  except Exception as e:  # pylint: disable=broad-except
    reason = ' '.join(line.strip() for line in str(e).splitlines())
  else:
    if batches:
      rows = sum(len(next(iter(b.values()))) for b in batches)
      return (batches, f'{rows} rows of {cfg.data.name} '
              f'{cfg.data.eval_split} data', '')
    reason = f'the {cfg.data.eval_split} split has no tokens'
  batches = _random_batches(trained, num_batches, batch_size)
  return (batches, f'{num_batches} x {batch_size} rows of random ids',
          f'The validation data is not available ({reason}); verifying on '
          'random in-vocab ids instead.')


def _model_inputs(kind: str, batch) -> dict[str, np.ndarray] | None:
  """A pipeline batch as model inputs and masks, without empty rows."""
  if batch is None:
    return None
  if family(kind).has_source:
    out = {'src': batch['src'], 'src_mask': batch['src_segment_ids'] > 0,
           'tgt': batch['tgt_in'], 'tgt_mask': batch['tgt_segment_ids'] > 0}
    keep = out['src_mask'].any(-1) & out['tgt_mask'].any(-1)
  else:
    out = {'ids': batch['inputs'], 'mask': batch['segment_ids'] > 0}
    keep = out['mask'].any(-1)
  if not keep.any():
    return None
  return {k: np.asarray(v)[keep] for k, v in out.items()}


def _random_batches(trained: Trained, num_batches: int, batch_size: int
                    ) -> list[dict[str, np.ndarray]]:
  rng = np.random.RandomState(0)
  length = min(trained.config.seq_len, 32)
  names = ('src', 'tgt') if family(trained.kind).has_source else ('ids',)
  batches = []
  for _ in range(num_batches):
    batch = {}
    for name in names:
      batch[name] = rng.randint(0, trained.tokenizer.vocab_size,
                                (batch_size, length)).astype(np.int32)
      batch['mask' if name == 'ids' else f'{name}_mask'] = np.ones(
          (batch_size, length), bool)
    batches.append(batch)
  return batches


def logits_fn(model: nnx.Module
              ) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
  """batch -> logits of the model's parameters, jitted, in float32 at full
  matmul precision (verification compares the mapping, not a bfloat16 run).

  A batch holds ``ids``, ``mask`` (decoder LM) or ``src``, ``src_mask``,
  ``tgt``, ``tgt_mask`` (encoder-decoder); masks are True at real tokens.
  """
  config = model.config.replace(dtype='float32', attention_implementation=None)
  model_def, _ = params_lib.abstract(lambda: type(model)(config, nnx.Rngs(0)))
  params = params_lib.split(model)[1]

  def forward(params, batch):
    m = model_def.merge(params)
    if 'ids' in batch:
      return m(batch['ids'], batch['mask'])
    return m(batch['src'], batch['tgt'], src_mask=batch['src_mask'],
             tgt_mask=batch['tgt_mask'])

  forward = jax.jit(forward)

  def run(batch):
    with jax.default_matmul_precision('highest'):
      return np.asarray(forward(params, batch))
  return run


def _compared_positions(batch: dict[str, np.ndarray]) -> np.ndarray:
  return batch['mask'] if 'mask' in batch else batch['tgt_mask']


def _torch_model(fmt: str, out: str):
  """The export loaded as its PyTorch user would (strict=True)."""
  import torch  # optional (the test extra): only PyTorch paths need it
  import transformers  # optional (the test extra), heavy
  if fmt == 'hf':
    return transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32).eval()
  with open(sidecar(out, CONFIG_SUFFIX)) as f:
    meta = json.load(f)
  if meta['layout'] == 'reference':
    # It imports torch, optional (the test extra).
    from jax_transformer.interop.torch_reference import TorchTransformer
    module = TorchTransformer(**meta['torch_config'])
  else:
    module = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(**meta['torch_config']))
  module.load_state_dict(torch.load(out, weights_only=True), strict=True)
  return module.eval()


def _torch_logits(module, batch: dict[str, np.ndarray]) -> np.ndarray:
  import torch  # optional (the test extra): only PyTorch paths need it
  t = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
  with torch.no_grad():
    if 'ids' in t:
      logits = module(input_ids=t['ids'].long(),
                      attention_mask=t['mask'].long()).logits
    else:
      logits = module(t['src'].long(), t['tgt'].long(),
                      src_key_padding_mask=~t['src_mask'],
                      tgt_key_padding_mask=~t['tgt_mask'])
  return logits.float().numpy()


def verify(trained: Trained, fmt: str, out: str,
           batches: list[dict[str, np.ndarray]],
           inputs: str = 'the batches') -> Verification:
  """The largest absolute logit difference between the export at ``out``
  (as PyTorch, or for safetensors a JAX model rebuilt from the file alone)
  and the workdir's model, over the real positions of ``batches``."""
  reference = logits_fn(trained.model)
  if fmt == 'safetensors':
    logits_of = logits_fn(model_from_safetensors(out))
  else:
    module = _torch_model(fmt, out)
    logits_of = lambda b: _torch_logits(module, b)
  diff = 0.0
  for batch in batches:
    real = _compared_positions(batch)
    got, want = logits_of(batch), reference(batch)
    worst = float(np.max(np.abs(got[real] - want[real])))
    diff = max(diff, worst if np.isfinite(worst) else float('inf'))
  return Verification(diff, inputs)


def check_verified(result: Verification, tolerance: float = TOLERANCE
                   ) -> None:
  """Raises VerificationError (one sentence) above ``tolerance``."""
  if not result.max_diff <= tolerance:
    raise VerificationError(
        f'Verification failed: the export\'s logits differ from the JAX '
        f'model\'s by up to {result.max_diff:.3g} on {result.inputs}, above '
        f'the tolerance {tolerance:g}.')
