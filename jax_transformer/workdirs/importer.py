"""Parameters from PyTorch, Hugging Face or safetensors files into a workdir
that train.py, scripts/generate.py and ``restore.load_for_inference``
accept.

``import_into(path, cfg, workdir)`` reads one of:

  * a Hugging Face folder of a decoder family (GPT-2, Llama, Mistral,
    Qwen2; ``interop/hf_families.py``), or a model id in the Hugging Face
    cache: ``config.json`` + ``model.safetensors`` (or its shards with their
    index) and ``tokenizer.json``. Every model field comes from its
    config.json whatever the config names (:func:`import_hf`); the tensors
    are streamed onto this host's devices. (A GPT-2 folder with only
    ``pytorch_model.bin`` is read through ``torch.load(weights_only=True)``
    by the older path, ``read_source``);
  * a file written by ``export --format safetensors`` (parameters under
    their dotted names, the model config in the metadata);
  * a PyTorch state_dict of the reference encoder-decoder or of
    ``GPT2LMHeadModel`` (``torch.save``, or a safetensors file without our
    metadata), with the ``.json`` that ``export --format torch`` writes
    beside it when there is one;

and writes the workdir as train.py does: an Orbax checkpoint at the file's
step (0 when it records none) holding the parameters, a fresh optimizer
state and an unread data position; ``config.json``; ``tokenizer/``.

The experiment config decides the architecture and the file must fit it:
every field the file records (a Hugging Face config, our model config) that
differs is named with the flags that would match it, and shapes that do not
fit name every key (``torch_compat``). ``model.vocab_size`` unset is taken
from the file. The tokenizer is the directory's ``tokenizer.json``, else
the ``<stem>.tokenizer/`` beside a file (as export writes it), else the
config's own (built as train.py builds it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Iterator

import numpy as np

from jax_transformer import data
from jax_transformer.data import batching, tokenizers
from jax_transformer.errors import UsageError, first_line
from jax_transformer.experiment import Experiment
from jax_transformer.interop import (
  hf_checkpoint,
  hf_families,
  hf_tokenizer,
  torch_compat,
  torch_layouts,
)
from jax_transformer.model import params as params_lib
from jax_transformer.model.config import ModelConfig
from jax_transformer.runtime import storage
from jax_transformer.runtime.storage import names
from jax_transformer.runtime.workdir import WorkdirPaths, resolve
from jax_transformer.train import (
  checkpoint,
  init_from,
  model_setup,
  run_plan,
  trainer,
)
from jax_transformer.workdirs import restore
from jax_transformer.workdirs.exporter import (
  CONFIG_SUFFIX,
  HF_CONFIG,
  HF_WEIGHTS,
  SAFETENSORS_FORMAT,
  TOKENIZER_SUFFIX,
  TORCH_FORMAT,
  build,
  read_safetensors,
  sidecar,
)

# Fields a fine-tuning run may change without changing the function.
_RUNTIME_FIELDS = ('dropout_rate', 'attention_dropout_rate', 'dtype',
                   'param_dtype', 'attention_implementation', 'dropout_rng',
                   'scan_layers', 'remat')
_EMBEDDING = {'reference': 'embed.weight', 'gpt2': 'transformer.wte.weight',
              'flat': 'embed.embedding'}


@dataclasses.dataclass(frozen=True, eq=False)
class Source:
  """What an import file holds."""
  path: str
  kind: str                  # the model kind its tensors are for
  layout: str                # 'reference', 'gpt2' or 'flat' (our names)
  tensors: dict[str, Any]
  fields: dict[str, Any]     # ModelConfig fields it records ({}: none)
  step: int
  tokenizer: Any | None
  unsupported: tuple[str, ...] = ()

  @property
  def vocab_size(self) -> int | None:
    embedding = self.tensors.get(_EMBEDDING[self.layout])
    if embedding is not None:
      return int(np.shape(embedding)[0])
    return self.fields.get('vocab_size')


def read_source(path: str) -> Source:
  if not os.path.exists(path):
    raise UsageError(f'--from {path} does not exist.')
  if os.path.isdir(path):
    return _read_hf_dir(path)
  tokenizer = _tokenizer_beside(path)
  if path.endswith('.safetensors'):
    tensors, meta = read_safetensors(path)
    if meta.get('format') == SAFETENSORS_FORMAT:
      return Source(path, meta['model_kind'], 'flat', tensors,
                    json.loads(meta['model_config']),
                    int(meta.get('step', 0)), tokenizer)
  else:
    tensors = _torch_load(path)
  meta = {}
  if os.path.exists(sidecar(path, CONFIG_SUFFIX)):
    with open(sidecar(path, CONFIG_SUFFIX)) as f:
      meta = json.load(f)
    if meta.get('format') != TORCH_FORMAT:
      meta = {}
  tensors = hf_families.with_gpt2_prefix(tensors)
  layout = meta.get('layout') or _guess_layout(path, tensors)
  kind = torch_layouts.kind_of(layout)
  return Source(path, kind, layout, tensors, meta.get('model_config', {}),
                int(meta.get('step', 0)), tokenizer)


def _torch_load(path: str) -> dict[str, Any]:
  import torch  # optional (the test extra): only PyTorch paths need it
  try:
    state_dict = torch.load(path, map_location='cpu', weights_only=True)
  except Exception as e:  # pylint: disable=broad-except
    raise UsageError(f'{path} cannot be read with torch.load(weights_only='
                     f'True): {first_line(e)}') from None
  if not isinstance(state_dict, dict):
    raise UsageError(f'{path} holds a {type(state_dict).__name__}, not a '
                     'state_dict.')
  return state_dict


def _guess_layout(path: str, tensors: dict[str, Any]) -> str:
  if 'transformer.wte.weight' in tensors:
    return 'gpt2'
  if 'embed.weight' in tensors:
    return 'reference'
  raise UsageError(f'{path} is neither a reference encoder-decoder '
                   'state_dict (embed.weight, transformer.encoder...) nor a '
                   'GPT2LMHeadModel one (transformer.wte.weight, ...).')


def _tokenizer_beside(path: str):
  directory = sidecar(path, TOKENIZER_SUFFIX)
  if os.path.isdir(directory):
    return tokenizers.load_tokenizer(directory)
  return None


def _read_hf_dir(path: str) -> Source:
  config_path = os.path.join(path, HF_CONFIG)
  if not os.path.exists(config_path):
    raise UsageError(f'--from {path} is a directory without {HF_CONFIG}: '
                     'not a Hugging Face model directory.')
  with open(config_path) as f:
    hf = json.load(f)
  if hf.get('model_type') != 'gpt2':
    raise UsageError(f'{path} holds a {hf.get("model_type")!r} model; '
                     'import it with import_into (Hugging Face families: '
                     'hf_checkpoint.hf_source).')
  if not os.path.exists(os.path.join(path, 'tokenizer.json')):
    raise UsageError(f'{path} has no tokenizer.json; save its tokenizer '
                     'there with tokenizer.save_pretrained(...) first.')
  fields, unsupported = hf_families.model_fields_from_gpt2(hf)
  return Source(path, 'decoder_lm', 'gpt2',
                hf_families.with_gpt2_prefix(_hf_weights(path)), fields, 0,
                tokenizers.HuggingFaceTokenizer.from_pretrained(path),
                tuple(unsupported))


def _hf_weights(path: str) -> dict[str, Any]:
  """model.safetensors, its shards, or (only then) pytorch_model.bin."""
  single = os.path.join(path, HF_WEIGHTS)
  index = single + '.index.json'
  if os.path.exists(single):
    return read_safetensors(single)[0]
  if os.path.exists(index):
    with open(index) as f:
      shards = sorted(set(json.load(f)['weight_map'].values()))
    tensors = {}
    for shard in shards:
      tensors.update(read_safetensors(os.path.join(path, shard))[0])
    return tensors
  binary = os.path.join(path, 'pytorch_model.bin')
  if os.path.exists(binary):
    return _torch_load(binary)
  raise UsageError(f'{path} has no {HF_WEIGHTS}, its index or '
                   'pytorch_model.bin.')


def _architecture(fields: dict[str, Any]) -> dict[str, Any]:
  """The fields that change the model's function (num_kv_heads resolved)."""
  arch = {k: v for k, v in fields.items() if k not in _RUNTIME_FIELDS}
  if 'num_kv_heads' in arch and arch['num_kv_heads'] is None:
    arch['num_kv_heads'] = arch.get('num_heads')
  return arch


def fit_config(cfg: Experiment, source: Source, tokenizer
               ) -> tuple[Experiment, ModelConfig, list[str]]:
  """(cfg, its model config, flags a later train.py needs beyond the given
  ones), cfg's ``model.vocab_size`` the file's where it is unset and the
  tokenizer would give another size; refuses a file that does not fit.
  """
  if source.kind != cfg.model_kind:
    raise UsageError(f'{source.path} holds a {source.kind} model but the '
                     f'config\'s model_kind is {cfg.model_kind!r}.')
  if source.unsupported:
    raise UsageError(f'{source.path} has {", ".join(source.unsupported)}, '
                     'which the GPT-2 layout here cannot hold.')
  extra_flags = []
  try:
    vocab = source.vocab_size
    if (cfg.model.vocab_size is None and vocab is not None and vocab !=
        cfg.model_config(tokenizer.vocab_size).vocab_size):
      cfg = cfg.replace(**{'model.vocab_size': vocab})
      extra_flags.append(f'--config.model.vocab_size={vocab}')
    model_config = cfg.model_config(tokenizer.vocab_size)
  except ValueError as e:
    raise UsageError(str(e)) from None
  file_arch = _architecture(source.fields)
  ours = _architecture(dataclasses.asdict(model_config))
  wrong = {k: v for k, v in file_arch.items() if k in ours and ours[k] != v}
  if wrong:
    theirs = ', '.join(f'{k}={v!r}' for k, v in wrong.items())
    have = ', '.join(f'{k}={ours[k]!r}' for k in wrong)
    flags = ' '.join(f'--config.model.{k}={v}' for k, v in wrong.items())
    raise UsageError(f'{source.path} holds a model with {theirs}, but '
                     f'config.model has {have}; add {flags} to import it.')
  return cfg, model_config, extra_flags


def build_params(source: Source, model_config: ModelConfig):
  """The flat parameters of the model the file holds, shape-checked."""
  try:
    if source.layout == 'flat':
      model = torch_compat.module_from_flat(
          source.tensors, build(source.kind, model_config),
          model_config.params_dtype)
    else:
      model = torch_layouts.of_kind(source.kind).from_torch(source.tensors,
                                                            model_config)
  except ValueError as e:
    raise UsageError(f'{source.path}: {e}') from None
  return params_lib.split(model)[1]


def config_tokenizer(cfg: Experiment, path: str):
  """The config's tokenizer, as train.py builds it."""
  try:
    return trainer.prepare_data(cfg).tokenizer
  except Exception as e:  # pylint: disable=broad-except
    raise UsageError(
        f'{path} has no tokenizer beside it '
        f'({sidecar(path, TOKENIZER_SUFFIX)}/) and the config\'s data '
        f'cannot give one: {first_line(e)}') from None


def write_workdir(workdir: str | WorkdirPaths, cfg: Experiment,
                  tokenizer, params, step: int) -> None:
  """A checkpoint at ``step`` of ``params`` with a fresh optimizer state and
  an unread data position, plus config.json and tokenizer/."""
  try:
    setup = model_setup.build(cfg, tokenizer.vocab_size)
  except ValueError as e:
    raise UsageError(str(e)) from None
  data_state = data.initial_state(cfg.train_batches)
  save(workdir, cfg, tokenizer, setup.state_for(params, cfg.seed, step),
       data_state)


def save(workdir: str | WorkdirPaths, cfg: Experiment,
         tokenizer, state, data_state) -> None:
  """config.json, tokenizer/ and a checkpoint of state: the last step of
  an import, after everything that can be refused."""
  checkpoint.save_side_files(workdir, cfg.saved_form(), cfg.data,
                             tokenizer)
  checkpointer = checkpoint.Checkpointer(workdir, async_save=False)
  try:
    checkpointer.save(state, data_state)
    checkpointer.wait()
  finally:
    checkpointer.close()


def new_workdir(workdir: str) -> WorkdirPaths:
  """--workdir resolved, refused in one sentence unless it is new or an
  empty folder."""
  paths = resolve(workdir)
  if names(paths.root):
    raise UsageError(f'--workdir {workdir} is not empty; import into a new '
                     'directory.')
  return paths


@contextlib.contextmanager
def staged(workdir: WorkdirPaths) -> Iterator[WorkdirPaths]:
  """Where to write the workdir so that it appears whole or not at all
  (``storage.written_whole``): a refusal or failure leaves it as it was,
  and the same command can run again."""
  with storage.written_whole(workdir.root) as root:
    yield WorkdirPaths(workdir.given, root)


@dataclasses.dataclass(frozen=True)
class Imported:
  workdir: str
  step: int
  model_config: ModelConfig
  extra_flags: list[str]   # for train.py, beyond the import's own
  notes: list[str]


def import_into(path: str, cfg: Experiment,
                workdir: str, explicit: set[str] = frozenset()) -> Imported:
  """Reads ``path``, checks it against ``cfg`` and writes ``workdir``.

  A Hugging Face folder (or a model id in its cache) gives every model
  field (:func:`import_hf`); ``explicit`` names the ``model.*`` fields
  given on the command line, refused where they differ.
  """
  target = new_workdir(workdir)
  folder = hf_checkpoint.hf_folder(path)
  if folder is not None and any(
      os.path.exists(os.path.join(folder, name))
      for name in (HF_WEIGHTS, hf_checkpoint.HF_INDEX)):
    return import_hf(folder, path, cfg, target, explicit)
  source = read_source(path)
  tokenizer = source.tokenizer or config_tokenizer(cfg, path)
  cfg, model_config, extra_flags = fit_config(cfg, source, tokenizer)
  params = build_params(source, model_config)
  with staged(target) as partial:
    write_workdir(partial, cfg, tokenizer, params, source.step)
  notes = reserved_id_notes(tokenizer)
  return Imported(workdir, source.step, model_config, extra_flags, notes)


def reserved_id_notes(tokenizer) -> list[str]:
  """A note where the tokenizer's BOS/EOS are not the project's reserved
  ids (``reserved_ids.py``), saying what the rows use instead; else
  none."""
  moved = [m for m in hf_tokenizer.reserved_id_mismatches(tokenizer)
           if not m.startswith('pad ')]  # padding has weight 0 anyway
  if not moved:
    return []
  bos, eos = batching.markers(tokenizer)
  return [f"The tokenizer's own BOS (id {bos}) and EOS (id {eos}), not the "
          "project's reserved 1 and 2, begin and end every training row, "
          'and generate.py stops at that EOS.']


def import_hf(folder: str, path: str, cfg: Experiment,
              workdir: str | WorkdirPaths,
              explicit: set[str] = frozenset()) -> Imported:
  """A Hugging Face model into ``workdir``: every model field from its
  config.json (the config gives data and optimizer), its tokenizer, its
  tensors streamed onto this host's devices (``hf_checkpoint.place_tensors``)
  and saved as a step-0 checkpoint with a fresh optimizer state."""
  source = hf_checkpoint.hf_source(folder, path)
  cfg = init_from.apply_fields(cfg, path, source.model_kind, source.fields,
                                set(explicit)).replace(init_from=path)
  tokenizer = source.tokenizer()
  try:
    setup = model_setup.build(cfg, tokenizer.vocab_size)
  except ValueError as e:
    raise UsageError(str(e)) from None
  data_state = data.initial_state(cfg.train_batches)
  plan = run_plan.build(cfg, restore.local_mesh(setup), tokenizer.vocab_size,
                        setup)
  state = init_from.Start(source, tokenizer).state(setup, cfg.seed,
                                                    plan.shardings)
  with staged(resolve(workdir)) as partial:
    save(partial, cfg, tokenizer, state, data_state)
  notes = [f'{path} is a {source.what} model: every config.model field was '
           'taken from its config.json.', *reserved_id_notes(tokenizer)]
  return Imported(str(workdir), 0, setup.model_config,
                  [f'--config.init_from={path}'], notes)
