"""A training workdir opened for inference: its config, tokenizer, model
definition and parameters (one checkpoint, or the average of several as in
the paper), placed on a mesh.

Sits above ``checkpoint`` and ``experiment``: scripts that score, decode or
export a trained model start here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding

from jax_transformer.data import corpus
from jax_transformer.data.tokenizers import fingerprint, load_tokenizer
from jax_transformer.decoding import inference
from jax_transformer.errors import UsageError, named_line
from jax_transformer.experiment import Experiment
from jax_transformer.interop import hf_checkpoint
from jax_transformer.model import families, sharding
from jax_transformer.runtime.workdir import (
  CONFIG_FILE,
  TOKENIZER_DIR,
  WorkdirPaths,
  resolve,
)
from jax_transformer.train import checkpoint, init_from, model_setup


@dataclasses.dataclass(frozen=True, eq=False)
class Workdir:
  """What a training directory holds, before any parameters are read.

  ``path`` is the workdir as given (for messages); ``paths`` says where its
  files are (resolved once, when it was opened).
  """
  path: str
  paths: WorkdirPaths
  config: Experiment
  tokenizer: Any
  setup: model_setup.Setup
  steps: tuple[int, ...]  # checkpointed steps, ascending
  # data.json (data/corpus.py): what the run's data was; None for a
  # workdir written before it was recorded.
  data_record: dict | None = None

  def model(self, params):
    return self.setup.model_def.merge(params)


def open_workdir(location: str | WorkdirPaths) -> Workdir:
  """Reads config.json, data.json and tokenizer/ and lists the
  checkpoints; the config's data is the prepared dataset data.json names
  (``data.corpus.for_inference``).

  Raises UsageError with one sentence when path is not a training
  directory, its config.json or tokenizer cannot be read or do not go
  together, or it holds no checkpoint.
  """
  paths = resolve(location)
  path = str(paths)
  if not paths.root.is_dir():
    raise UsageError(f'{path} is not a directory; give a training workdir.')
  try:
    cfg = checkpoint.load_config(paths)
  except UsageError:  # a field no experiment has
    raise
  except ValueError as e:  # json.JSONDecodeError
    raise UsageError(f'{path}/{CONFIG_FILE} is not valid JSON '
                     f'({e}); restore it from the training run.') from None
  if cfg is None:
    raise UsageError(f'{path} has no {CONFIG_FILE}: not a '
                     'training workdir (train.py writes one).')
  # The prepared dataset training read, by the name it recorded: neither
  # the corpus nor the directory training ran in is needed.
  record = corpus.read(paths.root)
  cfg = cfg.replace(data=corpus.for_inference(cfg.data, record))
  tokenizer = _tokenizer(paths)
  setup = model_setup.build_model(cfg, tokenizer.vocab_size)
  checkpointer = checkpoint.Checkpointer(paths, async_save=False)
  try:
    steps = tuple(sorted(checkpointer.manager.all_steps()))
  finally:
    checkpointer.close()
  if not steps:
    raise UsageError(f'{path} holds no checkpoint yet; train it first.')
  return Workdir(path, paths, cfg, tokenizer, setup, steps, record)


def _tokenizer(paths: WorkdirPaths):
  """The tokenizer saved in the workdir (UsageError if absent)."""
  directory = paths.tokenizer
  if not directory.is_dir():
    raise UsageError(f'{paths} has no {TOKENIZER_DIR}/ directory: '
                     'the tokenizer it was trained with is missing; restore '
                     'it from the training run.')
  try:
    tokenizer = load_tokenizer(directory)
  except (OSError, ValueError, KeyError, RuntimeError) as e:
    raise UsageError(f'{directory} cannot be read as a tokenizer '
                     f'({named_line(e)}); restore it '
                     'from the training run.') from None
  marker = paths.fingerprint
  if marker.exists():
    if marker.read_text().strip() != fingerprint(tokenizer):
      raise UsageError(f'{directory} no longer matches its fingerprint in '
                       f'{marker}: it was changed after training; restore '
                       'the tokenizer the model was trained with.')
  return tokenizer


def choose_steps(workdir: Workdir, step: int | None = None,
                 average_last: int = 1) -> list[int]:
  """The checkpoint steps to read: ``step`` (default the latest) and the
  ``average_last - 1`` checkpoints before it."""
  if average_last < 1:
    raise UsageError(f'--average_last must be at least 1, got {average_last}.')
  if step is None:
    step = workdir.steps[-1]
  if step not in workdir.steps:
    raise UsageError(f'{workdir.path} has no checkpoint at step {step}; it '
                     f'has steps {list(workdir.steps)}.')
  upto = [s for s in workdir.steps if s <= step]
  if len(upto) < average_last:
    raise UsageError(f'Cannot average the last {average_last} checkpoints up '
                     f'to step {step}: {workdir.path} keeps only {upto}.')
  return upto[-average_last:]


def param_shardings(workdir: Workdir, mesh) -> dict[str, NamedSharding]:
  """The training run's parameter shardings on ``mesh``."""
  specs = sharding.param_specs(workdir.setup.model_def.logical_axes)
  return {k: NamedSharding(mesh, specs[k]) for k in specs}


_EARLIER = 'use an earlier one (--step N, or move this one aside)'


def check_readable(workdir: Workdir, step: int) -> None:
  """Raises UsageError when the checkpoint at step has no readable list of
  its parameters (a torn or corrupt write). Their shapes are checked
  against the config by ``Checkpointer.restore_params``."""
  path = workdir.paths.checkpoint(step) / 'params'
  try:
    ocp.StandardCheckpointHandler().metadata(path)
  except (OSError, ValueError) as e:  # missing, or not JSON
    raise UsageError(f'Checkpoint step {step} in {workdir.path} has no '
                     'readable list of parameters '
                     f'({named_line(e)}): it is torn or '
                     f'corrupt; {_EARLIER}.') from None


def _restore(checkpointer: checkpoint.Checkpointer, workdir: Workdir,
             abstract: dict[str, jax.ShapeDtypeStruct], step: int
             ) -> dict[str, jax.Array]:
  check_readable(workdir, step)
  try:
    return checkpointer.restore_params(abstract, step)
  except UsageError:  # a checkpoint of another model (CheckpointMismatch)
    raise
  except Exception as e:  # pylint: disable=broad-except
    # Names and shapes fit, so what fails here is reading the arrays'
    # bytes. Orbax reports that as a bare Exception whose first cause says
    # which file and why.
    cause = e
    while cause.__cause__ is not None:
      cause = cause.__cause__
    raise UsageError(f'Checkpoint step {step} in {workdir.path} cannot be '
                     f'read ({named_line(cause)}): '
                     f'it is torn or corrupt; {_EARLIER}.') from e


def restore_params(workdir: Workdir, steps: Sequence[int], mesh
                   ) -> dict[str, jax.Array]:
  """The parameters of one checkpoint, or their mean over several (summed
  in float64 on the host, so the order of steps does not matter), placed as
  in training on ``mesh``. A checkpoint that does not fit the workdir's
  config or cannot be read raises UsageError."""
  shardings = param_shardings(workdir, mesh)
  abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k])
              for k, v in workdir.setup.abstract_params.items()}
  checkpointer = checkpoint.Checkpointer(workdir.paths, async_save=False,
                                         read_base=init_from.frozen_base)
  try:
    if len(steps) == 1:
      return _restore(checkpointer, workdir, abstract, steps[0])
    total = None
    for step in steps:
      params = jax.device_get(_restore(checkpointer, workdir, abstract, step))
      params = {k: np.asarray(v, np.float64) for k, v in params.items()}
      total = params if total is None else {
          k: total[k] + params[k] for k in total}
  finally:
    checkpointer.close()
  mean = {k: (v / len(steps)).astype(abstract[k].dtype)
          for k, v in total.items()}
  return {k: jax.device_put(v, shardings[k]) for k, v in mean.items()}


def inference_mesh(workdir: Workdir, devices: Sequence[jax.Device] | None
                   = None) -> Mesh:
  """The mesh a trained model is restored onto to be scored, decoded or
  exported: over this host's devices (``jax.local_devices()``, or
  ``devices``), never another host's, so that one machine of a pod (or any
  machine with several accelerators) holds a model larger than one device.

  Chosen in this order, the first whose axes divide every parameter:

  1. the training run's ``config.mesh`` sizes, when they multiply to the
     number of devices here (a -1 takes the rest: ``fsdp=-1``, as in
     ``lm_7b``, spreads the parameters over all of them);
  2. else :func:`local_mesh`: as many of the devices on ``'fsdp'`` as
     divide every parameter (parameters split along their ``'embed'``
     dimension, the rest replicated), when the training mesh needs more
     (or other) devices than this host has.
  """
  devices = list(jax.local_devices() if devices is None else devices)
  trained_on = {axis: getattr(workdir.config.mesh, axis)
                for axis in sharding.MESH_AXES}
  try:
    mesh = sharding.make_mesh(trained_on, devices)
    sharding.check_divisible(
        {k: v.shape for k, v in workdir.setup.abstract_params.items()},
        sharding.param_specs(workdir.setup.model_def.logical_axes), mesh)
  except UsageError:
    return local_mesh(workdir.setup, devices)
  return mesh


def local_mesh(setup: model_setup.Setup,
               devices: Sequence[jax.Device] | None = None) -> Mesh:
  """This host's devices (or ``devices``) on 'fsdp', the first k, k the
  largest divisor of their number that divides every parameter (1 at
  worst): where a model is placed that no training mesh places (a Hugging
  Face folder, read or imported), and a workdir whose training mesh does
  not fit here."""
  return sharding.fsdp_mesh(
      setup.abstract_params, setup.model_def.logical_axes,
      list(jax.local_devices() if devices is None else devices))


def load(path: str | WorkdirPaths, step: int | None = None,
         devices: Sequence[jax.Device] | None = None
         ) -> tuple[Workdir, dict[str, jax.Array], int]:
  """(the workdir, the parameters of its checkpoint at ``step`` (default:
  the latest) placed as in training on ``inference_mesh(workdir,
  devices)``, that step), for decoding or export. Bad input raises
  UsageError (see open_workdir)."""
  workdir = open_workdir(path)
  (step,) = choose_steps(workdir, step)
  mesh = inference_mesh(workdir, devices)
  return workdir, restore_params(workdir, [step], mesh), step


@dataclasses.dataclass(frozen=True, eq=False)
class Trained:
  """One checkpoint of a workdir, loaded: the model holding its parameters,
  the tokenizer and config it was trained with, and its step."""
  model: Any
  tokenizer: Any
  config: Experiment
  step: int
  mesh: Mesh | None = None  # where the parameters are (inference_mesh)

  @property
  def kind(self) -> str:
    return self.config.model_kind

  @property
  def family(self) -> families.Family:
    """The record of the model's kind."""
    return families.family(self.kind)

  @property
  def stream(self) -> bool:
    """A language model trained on a token stream: its prompts take no
    BOS (``decoding.inference.layout``)."""
    return (not self.family.has_source
            and inference.streamed(self.config.data))


def load_model(workdir: str | WorkdirPaths, step: int | None = None,
               devices: Sequence[jax.Device] | None = None) -> Trained:
  """The checkpoint at ``step`` (default: the latest) of a trained workdir,
  sharded over this host's devices (or ``devices``) as ``inference_mesh``
  chooses; or a Hugging Face folder (a decoder family's config.json and
  safetensors, or a model id in the local cache) read as the importer
  reads it, nothing written. Bad input raises UsageError in one sentence
  (see open_workdir)."""
  folder = (hf_checkpoint.hf_folder(workdir) if isinstance(workdir, str)
            else None)
  if folder is not None:
    return load_hf_folder(folder, workdir, step, devices)
  opened, params, step = load(workdir, step, devices)
  mesh = next(iter(params.values())).sharding.mesh
  return Trained(opened.model(params), opened.tokenizer, opened.config, step,
                 mesh)


def load_hf_folder(folder: str, given: str, step: int | None = None,
                   devices: Sequence[jax.Device] | None = None) -> Trained:
  """A Hugging Face model folder as a trained model (step 0): every model
  field from its config.json, its tokenizer, its tensors streamed onto
  this host's devices on ``'fsdp'`` as ``import_params.py`` places them;
  no optimizer is built and nothing is written."""
  if step not in (None, 0):
    raise UsageError(f'{given} is a Hugging Face folder: it has one set of '
                     f'weights, not steps; drop --step {step}.')
  source = hf_checkpoint.hf_source(folder, given)
  cfg = init_from.apply_fields(Experiment(), given,
                               source.model_kind, source.fields, set())
  cfg = cfg.replace(init_from=given)
  tokenizer = source.tokenizer()
  try:
    setup = model_setup.build_model(cfg, tokenizer.vocab_size)
  except ValueError as e:  # a field out of range, said in one sentence
    raise UsageError(str(e)) from None
  mesh = local_mesh(setup, devices)
  specs = sharding.param_specs(setup.model_def.logical_axes)
  params = source.place(setup.model_config,
                        {k: NamedSharding(mesh, specs[k]) for k in specs})
  return Trained(setup.model_def.merge(params), tokenizer, cfg, 0, mesh)


def load_for_inference(workdir: str | WorkdirPaths, step: int | None = None):
  """(model, tokenizer) from a trained workdir, its parameters sharded
  over this host's devices as in training where they fit
  (``inference_mesh``).

  The model is an EncoderDecoder or DecoderLM holding the parameters of
  the checkpoint at ``step`` (default: the latest); the tokenizer is the
  one it was trained with. Bad input (no such workdir, no checkpoint, a
  missing tokenizer, a checkpoint that does not fit config.json or cannot
  be read) raises ``errors.UsageError`` in one sentence.
  """
  trained = load_model(workdir, step)
  return trained.model, trained.tokenizer
