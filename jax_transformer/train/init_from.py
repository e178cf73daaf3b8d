"""Starting a run from a pretrained model: ``config.init_from``.

``config.init_from`` names a Hugging Face model folder (``config.json``,
``model.safetensors`` or its shards with ``model.safetensors.index.json``,
``tokenizer.json``), a model id in the Hugging Face cache
(``meta-llama/Llama-3.2-1B``, read offline), or another training workdir.
Then:

* :func:`resolve_model` sets every architecture field of ``config.model``
  (and ``model_kind``) from the checkpoint, before any check or setup; the
  runtime fields (dtype, dropout, scanned layers, remat) stay the config's.
  A field also given on the command line with another value is refused in
  one sentence;
* :func:`start` (the trainer's, when the workdir has no checkpoint yet)
  gives the checkpoint's tokenizer and its parameters,
  placed straight onto the run's shardings (``interop/hf_checkpoint.py``
  reads a Hugging Face folder tensor by tensor);
* :func:`frozen_base` reads a LoRA run's frozen base again at each start.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
from jax.sharding import NamedSharding

from jax_transformer.data.tokenizers import load_tokenizer
from jax_transformer.errors import UsageError, first_line
from jax_transformer.experiment import Experiment
from jax_transformer.interop.hf_checkpoint import (
  HF_CONFIG,
  Source,
  complete_fields,
  hf_folder,
  hf_source,
  hugging_face_files,
)
from jax_transformer.model import lora, sharding
from jax_transformer.model import params as params_lib
from jax_transformer.runtime.workdir import WorkdirPaths, resolve
from jax_transformer.train import checkpoint, model_setup


def workdir_source(path: str) -> Source:
  """Another training workdir's latest checkpoint as a Source (a LoRA
  run's merged into its base)."""
  paths = resolve(path)
  cfg = checkpoint.load_config(paths)
  if cfg is None:
    raise UsageError(f'config.init_from={path} has no config.json: not a '
                     'training workdir.')
  tokenizer = load_tokenizer(paths.tokenizer)
  setup = model_setup.build_model(cfg, tokenizer.vocab_size)

  def place(model_config, shardings):
    del model_config  # the workdir's own
    mesh = next(iter(shardings.values())).mesh
    specs = sharding.param_specs(setup.model_def.logical_axes)
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                        sharding=NamedSharding(mesh, specs[k]))
                for k, v in setup.abstract_params.items()}
    reader = checkpoint.Checkpointer(paths, async_save=False,
                                     read_base=frozen_base)
    try:
      params = reader.restore_params(abstract)
    finally:
      reader.close()
    model_def = setup.model_def
    if isinstance(model_def, lora.LoraModelDef):  # a LoRA run: merged
      params = jax.jit(lambda p: lora.merged(p, model_def.targets,
                                             model_def.scale))(params)
    params = params_lib.to_layout(params,
                                  params_lib.is_scanned(shardings))
    return {k: jax.device_put(v, shardings[k]) for k, v in params.items()}

  return Source(path, 'workdir', cfg.model_kind,
                complete_fields(dataclasses.asdict(setup.model_config)),
                lambda: tokenizer, place)

def open_source(path: str) -> Source:
  """The Source ``path`` names, or UsageError in one sentence."""
  folder = hf_folder(path)
  if folder is not None:
    return hf_source(folder, path)
  if os.path.isdir(path):
    hf_files = hugging_face_files(path)
    if hf_files:
      said = ('its config.json names no model_type'
              if os.path.exists(os.path.join(path, HF_CONFIG))
              else f'it has no {HF_CONFIG}')
      raise UsageError(
          f'config.init_from={path} holds a Hugging Face model '
          f'({", ".join(hf_files)}) but {said}: save the model there with '
          "model.save_pretrained(...), which writes it, or copy the "
          f"model's {HF_CONFIG} beside its weights.")
    return workdir_source(path)
  raise UsageError(f'config.init_from={path} is neither a Hugging Face model '
                   'folder (config.json with a model_type), a model id in the '
                   'Hugging Face cache, nor a training workdir.')

# ----------------------------------------------------------------------------
# The trainer's calls.


def resolve_model(cfg: Experiment, workdir: WorkdirPaths | None = None,
                  explicit: set[str] = frozenset()
                  ) -> tuple[Experiment, Source | None]:
  """cfg with, where ``config.init_from`` is set, ``config.model_kind``
  and every architecture field of ``config.model`` the checkpoint's; and
  the Source opened for them (None: no init_from, or its path is gone and
  ``workdir`` already started from it: the fields that run saved).

  explicit: the fields given on the command line (``model.d_model``,
  ...); one of them with another value than the checkpoint's is refused
  in one sentence.
  """
  path = cfg.init_from
  if not path:
    return cfg, None
  path = os.fspath(path)
  if (not os.path.exists(path) and workdir is not None
      and workdir.config.exists() and hf_folder(path) is None):
    saved = json.loads(workdir.config.read_text())
    return apply_fields(cfg, path, saved['model_kind'],
                        complete_fields(saved['model']), explicit), None
  source = open_source(path)
  return apply_fields(cfg, path, source.model_kind, source.fields,
                      explicit), source


def apply_fields(cfg: Experiment, path: str, kind: str,
                 fields: Mapping[str, Any], explicit: set[str]
                 ) -> Experiment:
  """cfg with model_kind and config.model's architecture fields a
  source's, refusing one given explicitly with another value."""
  current = dataclasses.asdict(cfg.model)
  wrong = [f'model.{k}' for k, v in fields.items()
           if f'model.{k}' in explicit and current.get(k) != v]
  if 'model_kind' in explicit and cfg.model_kind != kind:
    wrong.insert(0, 'model_kind')
  if wrong:
    theirs = ', '.join(
        f'{k}={kind!r}' if k == 'model_kind' else
        f'{k.split(".", 1)[1]}={fields[k.split(".", 1)[1]]!r}' for k in wrong)
    raise UsageError(f'config.init_from={path} holds a model with {theirs}; '
                     f'drop --config.{" --config.".join(wrong)} (the model '
                     'comes from the checkpoint) or leave init_from unset.')
  cfg = cfg.replace(model_kind=kind, model=cfg.model.replace(
      **{k: v for k, v in fields.items() if k in current}))
  return fit_context(cfg, path, explicit)


def fit_context(cfg: Experiment, path: str, explicit: set[str]
                ) -> Experiment:
  """cfg with a seq_len (or data.src_len) longer than the pretrained
  model's context (its model.max_len) lowered to it, in one printed line,
  where the recipe set it; one given on the command line is refused in
  one sentence naming the figure to give (the context is the
  checkpoint's: raising model.max_len is refused)."""
  context = cfg.model.max_len
  for name in ('seq_len', 'data.src_len'):
    value = cfg.seq_len if name == 'seq_len' else cfg.data.src_len
    if value is None or value <= context:
      continue
    if name in explicit:
      raise UsageError(
          f'config.{name}={value} exceeds the context of the model of '
          f'config.init_from={path}: model.max_len={context}, the '
          f"checkpoint's; lower --config.{name} to {context} or less.")
    print(f'config.{name} lowered from {value} to {context}: the context '
          f'of the model of config.init_from={path} (model.max_len).',
          flush=True)
    cfg = cfg.replace(**{name: context})
  return cfg


@dataclasses.dataclass(frozen=True, eq=False)
class Start:
  """What a run starting from a pretrained model takes from it."""
  source: Source
  tokenizer: Any

  def state(self, setup, seed: int, shardings) -> dict[str, Any]:
    """The run's first train state: the checkpoint's parameters placed on
    ``shardings['params']``, a fresh optimizer state, step 0."""
    params = self.source.place(setup.model_config, shardings['params'])
    adapters = {k: v for k, v in shardings['params'].items()
                if lora.is_adapter(k)}
    if adapters:  # config.lora: fresh adapters on the frozen base
      key = jax.random.fold_in(jax.random.key(seed), 1)
      params.update(jax.jit(lambda: setup.init_adapters(key),
                            out_shardings=adapters)())
    return jax.jit(lambda p: setup.state_for(p, seed),
                   out_shardings=shardings, donate_argnums=0)(params)


def frozen_base(cfg: Experiment,
                abstract: Mapping[str, jax.ShapeDtypeStruct]
                ) -> dict[str, jax.Array]:
  """The frozen base of a LoRA run whose config is ``cfg`` (a workdir's
  config.json), read again from its config.init_from and placed on the
  shardings of ``abstract`` (the base parameters): what a restore adds to
  the adapters a checkpoint holds."""
  path = cfg.init_from
  if not path:
    raise UsageError('This run\'s checkpoints hold LoRA adapters alone but '
                     'its config.json has no init_from to read the base '
                     'model from.')
  try:
    source = open_source(os.fspath(path))
  except UsageError as e:
    raise UsageError(f'A LoRA run reads its frozen base from config.init_from'
                     f'={path} (as in its config.json, relative to the '
                     f'current directory) at every start: {e}') from None
  model_config = cfg.model_config(cfg.model.vocab_size or 1)
  params = source.place(model_config,
                        {k: v.sharding for k, v in abstract.items()})
  return {k: params[k] for k in abstract}


def start(source: Source) -> Start:
  """What a new run takes from the pretrained model ``source``: its
  parameters (later) and its tokenizer (now)."""
  try:
    tokenizer = source.tokenizer()
  except (OSError, ValueError) as e:
    raise UsageError(f'config.init_from={source.path}: its tokenizer cannot '
                     f'be read ({first_line(e)}).') from None
  return Start(source, tokenizer)
