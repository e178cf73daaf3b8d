"""Every check of an experiment config, in one place, each refusing bad
input in one sentence (``UsageError``) before any data is prepared or any
step compiled.

``check_run_fields`` (counts, intervals, paths), ``check_experiment`` (the
model kind and fields, lengths, the mesh against the devices and the
install, and batch sizes: returns the mesh), ``check_resumable`` (a
workdir trained with another model or data).
``model_config`` turns config.model into a ``ModelConfig``, whose own
construction checks the architecture's values (``model/config.py``).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import ml_collections

from jax_transformer import data
from jax_transformer.errors import UsageError
from jax_transformer.model import sharding
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import MODELS
from jax_transformer.runtime import storage, targets
from jax_transformer.runtime.workdir import WorkdirPaths, resolve

# Fields that count steps, batches or checkpoints: 0 would divide by zero
# after the first step or (keep_checkpoints) delete every checkpoint.
POSITIVE_FIELDS = ('num_steps', 'batch_size', 'eval_batch_size', 'seq_len',
                   'log_every', 'eval_every', 'checkpoint_every',
                   'keep_checkpoints')


def check_run_fields(cfg: ml_collections.ConfigDict) -> None:
  """Refuses, in one sentence and before any data preparation, a run
  field that is not a positive integer."""
  for name in POSITIVE_FIELDS:
    value = cfg.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise UsageError(f'config.{name} must be a positive integer, got '
                       f'{value!r}.')
  chunk = cfg.get('loss_chunk_size') or 0
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
    raise UsageError('config.loss_chunk_size must be a non-negative integer '
                     f'(0: the loss over all tokens at once), got {chunk!r}.')
  if (cfg.get('eval_bleu_examples') or 0) < 0:
    raise UsageError('config.eval_bleu_examples must be >= 0 (0 turns the '
                     f'BLEU check off), got {cfg.eval_bleu_examples!r}.')
  data_dir = cfg.data.get('data_dir')
  if data_dir and storage.is_remote(data_dir):
    # TFDS's array_record reader opens local files only.
    raise UsageError(f'config.data.data_dir={data_dir}: prepared data must '
                     'be on a local or mounted path (object storage works '
                     'for --workdir).')
  timeout = cfg.get('step_timeout_s')
  if timeout is not None and (isinstance(timeout, bool)
                              or not isinstance(timeout, (int, float))
                              or not timeout >= 0):
    raise UsageError('config.step_timeout_s must be a number of seconds >= 0 '
                     f'(0: never; unset: automatic), got {timeout!r}.')
  for name, least in (('worker_count', 0), ('worker_buffer_size', 1)):
    value = cfg.data.get(name, least)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      raise UsageError(f'config.data.{name} must be an integer >= {least}, '
                       f'got {value!r}.')
  profile = cfg.get('profile') or {}
  for name in ('start_step', 'num_steps'):
    value = profile.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise UsageError(f'config.profile.{name} must be a non-negative '
                       f'integer, got {value!r}.')
  if profile.get('num_steps') and not profile.get('start_step'):
    raise UsageError('config.profile.num_steps is set: set '
                     'config.profile.start_step to the first step to trace '
                     '(steps count from 1).')
  # The dataset named with its fields (a 'files' glob that matches
  # nothing, a task or lm_mode misspelt), before anything is prepared.
  data.spec_for(cfg.data)
  data.mixture.check(cfg.data)  # weights, labels, one task
  # data.tokenizer_path read, and not contradicted by tokenizer/vocab_size.
  data.datasets.given_tokenizer(cfg.data)
  init_from = cfg.get('init_from')
  if init_from is not None and not (isinstance(init_from, str)
                                    and init_from):
    raise UsageError('config.init_from must name a Hugging Face model folder, '
                     'a model id in its cache or a workdir, got '
                     f'{init_from!r}.')
  check_lora(cfg)
  skips = cfg.optim.get('max_skipped_updates', 0)
  if isinstance(skips, bool) or not isinstance(skips, int) or skips < 0:
    raise UsageError('config.optim.max_skipped_updates must be a '
                     'non-negative integer (0: stop at the first non-finite '
                     f'step), got {skips!r}.')


def check_lora(cfg: ml_collections.ConfigDict) -> None:
  """config.lora: a rank >= 0 (0: off), a positive alpha, and above 0 an
  init_from to read the frozen base from (at every start: checkpoints hold
  the adapters only). Targets are checked against the model in setup."""
  lora = cfg.get('lora') or {}
  rank = lora.get('rank', 0)
  if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
    raise UsageError(f'config.lora.rank must be an integer >= 0 (0: off), '
                     f'got {rank!r}.')
  if not rank:
    return
  alpha = lora.get('alpha')
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or \
      not alpha > 0:
    raise UsageError(f'config.lora.alpha must be a positive number, got '
                     f'{alpha!r}.')
  if not cfg.get('init_from'):
    raise UsageError(f'config.lora.rank={rank} trains adapters on a frozen '
                     'pretrained model: set config.init_from to it (it is '
                     'read again at every start and by generate/export).')


def check_experiment(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """The mesh, after refusing in one sentence a model config or a mesh
  that cannot work, before any data is prepared (the vocabulary is not
  known yet: a stand-in size checks everything else)."""
  check_model_kind(cfg)
  check_lengths(cfg, model_config(cfg, 1))
  check_accelerators(cfg.mesh)
  mesh = sharding.make_mesh(cfg.mesh)
  sharding.check_batch(cfg.batch_size, mesh)
  sharding.check_batch(cfg.eval_batch_size, mesh)
  return mesh


def check_accelerators(sizes, devices: list | None = None) -> None:
  """Refuses, naming the extra to install, a mesh that asks for more
  devices than there are where JAX found only CPUs (an install without a
  TPU or GPU runtime, or one run where there is no accelerator)."""
  devices = jax.devices() if devices is None else devices
  asked = 1
  for axis in sharding.MESH_AXES:
    size = sizes.get(axis, 1)
    if isinstance(size, int) and size > 0:
      asked *= size
  if asked <= len(devices) or any(d.platform != 'cpu' for d in devices):
    return
  found = f'{len(devices)} CPU device{"s" if len(devices) > 1 else ""}'
  runtimes = targets.accelerator_runtimes()
  if runtimes:
    raise UsageError(
        f'config.mesh asks for {asked} devices but JAX found {found} and no '
        f'accelerator here, although {" and ".join(runtimes)} '
        f'{"is" if len(runtimes) == 1 else "are"} installed (no TPU or GPU '
        'on this machine, or JAX_PLATFORMS=cpu): run it on the TPU VM or GPU '
        f'hosts, installed there with {targets.RUN_INSTALL}.')
  raise UsageError(
      f'config.mesh asks for {asked} devices but this install has {found} '
      f'and no TPU or GPU runtime: {targets.RUN_INSTALL}.')


# Fields that change how a step computes or where files are, not what the
# state holds or which examples come next: a run may resume with other
# values of these (intervals and other top-level fields are not compared).
RUNTIME_MODEL_FIELDS = ('dtype', 'attention_implementation', 'dropout_rate',
                        'attention_dropout_rate', 'dropout_rng', 'scan_layers',
                        'remat')
# worker_count is judged by the saved stream itself (pipeline.Batches).
RUNTIME_DATA_FIELDS = ('data_dir', 'worker_count', 'worker_buffer_size',
                       'prepare_workers')


def check_resumable(cfg: ml_collections.ConfigDict,
                    workdir: str | WorkdirPaths) -> None:
  """Refuses to resume a workdir trained with another model or data."""
  paths = resolve(workdir)
  if not paths.config.exists():
    return
  saved = ml_collections.ConfigDict(json.loads(paths.config.read_text()))
  saved, current = json.loads(saved.to_json()), json.loads(cfg.to_json())
  if isinstance(saved.get('model'), dict):  # fields added since: defaults
    for field in dataclasses.fields(ModelConfig):
      saved['model'].setdefault(field.name, field.default)
  if isinstance(saved.get('data'), dict):  # data fields added since, unset
    for name, value in current.get('data', {}).items():
      if name not in saved['data'] and value in (None, '', (), []):
        saved['data'][name] = value
  for key, names in (('model', RUNTIME_MODEL_FIELDS),
                     ('data', RUNTIME_DATA_FIELDS)):
    for c in (saved, current):
      for name in names:
        c.get(key, {}).pop(name, None)
  if not (saved.get('lora') or {}).get('rank') and not (
      current.get('lora') or {}).get('rank'):
    saved.pop('lora', None)  # off on both sides (or saved before LoRA)
    current.pop('lora', None)
  for key in ('model_kind', 'model', 'data', 'lora'):
    if saved.get(key) != current.get(key):
      old, new = saved.get(key), current.get(key)
      fields = (sorted(f for f in set(old) | set(new)
                       if old.get(f) != new.get(f))
                if isinstance(old, dict) and isinstance(new, dict) else [])
      raise UsageError(
          f'{workdir} holds a run with a different config.{key}'
          + (f' ({", ".join(fields)})' if fields else '')
          + '; use a new --workdir or the same config to resume.')


def check_model_kind(cfg: ml_collections.ConfigDict) -> type:
  """The model class of config.model_kind."""
  if cfg.model_kind not in MODELS:
    raise UsageError(f'model_kind must be one of {sorted(MODELS)}, got '
                     f'{cfg.model_kind!r}.')
  return MODELS[cfg.model_kind]


def model_config(cfg: ml_collections.ConfigDict,
                 tokenizer_vocab: int) -> ModelConfig:
  """config.model's fields, with vocab_size None meaning the tokenizer's
  (rounded up to ``config.vocab_multiple`` so it splits over 'tensor')."""
  fields = cfg.model.to_dict()
  known = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise UsageError(f'config.model has unknown fields {unknown}.')
  if fields.get('vocab_size') is None:
    multiple = int(cfg.get('vocab_multiple', 1))
    fields['vocab_size'] = -(-tokenizer_vocab // multiple) * multiple
  elif fields['vocab_size'] < tokenizer_vocab:
    raise UsageError(f'config.model.vocab_size={fields["vocab_size"]} is '
                     f'smaller than the tokenizer\'s {tokenizer_vocab}; '
                     'raise it, or unset it to use the tokenizer\'s.')
  return ModelConfig(**fields)


def check_lengths(cfg: ml_collections.ConfigDict, mc: ModelConfig) -> None:
  """Sequences must fit the model's max_len (a learned table has no more)."""
  for name, length in (('seq_len', cfg.seq_len),
                       ('data.src_len', cfg.data.get('src_len'))):
    if length is not None and length > mc.max_len:
      raise UsageError(f'config.{name}={length} exceeds model.max_len='
                       f'{mc.max_len}; raise max_len or shorten sequences.')
