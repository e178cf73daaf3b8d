"""The experiment: every setting of a training run, typed and frozen.

An :class:`Experiment` is the run's own fields (steps, batches,
checkpointing, evaluation, logging, timeouts) and one frozen dataclass per
part, each owning its defaults and its checks; each part is built in the
room that uses it:

  model    ``model.config.ModelConfig`` (vocab_size None: the tokenizer's)
  lora     ``parts.LoraConfig``    ``model.lora.apply(config.lora, ...)``
  mesh     ``parts.MeshConfig``    ``sharding.make_mesh(config.mesh.sizes)``
  data     ``data.DataConfig``     read by the whole data room
  optim    ``parts.OptimConfig``   ``train.optim.build(config.optim, ...)``
  sample   ``parts.SampleConfig``
  eval_harness ``parts.EvalHarnessConfig``  ``harness.during_training``
  profile  ``parts.ProfileConfig``

Nothing here imports JAX: a config file reads this package before JAX
starts (``train.py --aot_target`` starts a target's compiler first).

``configs/*.py`` write it as an ``ml_collections.ConfigDict``
(:func:`base_config` gives the defaults in that form) so that every
``--config.a.b=value`` keeps its path and type; :meth:`Experiment.of`
turns that, or a workdir's ``config.json`` (fields added since take their
defaults), into the typed form every module reads.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ml_collections import ConfigDict

from jax_transformer import fields
from jax_transformer.errors import UsageError
from jax_transformer.experiment.data import DataConfig
from jax_transformer.experiment.parts import (
  EvalConfig,
  EvalHarnessConfig,
  LoraConfig,
  MeshConfig,
  OptimConfig,
  ProfileConfig,
  SampleConfig,
  StepShape,
  TrainBatches,
)
from jax_transformer.experiment.paths import absolute_paths
from jax_transformer.model import config as model_config_lib
from jax_transformer.model import families
from jax_transformer.model.config import ModelConfig

# Fields that count steps, batches or checkpoints: 0 would divide by zero
# after the first step or (keep_checkpoints) delete every checkpoint.
POSITIVE_FIELDS = ('num_steps', 'batch_size', 'eval_batch_size', 'seq_len',
                   'log_every', 'eval_every', 'checkpoint_every',
                   'keep_checkpoints')

# Fields that change how a step computes or where files are, not what the
# state holds or which examples come next: a run may resume with other
# values of these (intervals and other top-level fields are not compared).
RUNTIME_MODEL_FIELDS = ('dtype', 'attention_implementation', 'dropout_rate',
                        'attention_dropout_rate', 'dropout_rng', 'scan_layers',
                        'remat')
# worker_count is judged by the saved stream itself (pipeline.Batches).
# accept_changed_corpus is judged against the corpus itself (data/corpus.py).
RUNTIME_DATA_FIELDS = ('data_dir', 'worker_count', 'worker_buffer_size',
                       'prepare_workers', 'accept_changed_corpus')


def _default_model() -> ModelConfig:
  return model_config_lib.small_lm(vocab_size=None)


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One training run (docs/training.md lists the fields)."""
  # A key of model.families.FAMILIES: 'decoder_lm' or 'encoder_decoder'.
  model_kind: str = 'decoder_lm'
  model: ModelConfig = dataclasses.field(default_factory=_default_model)
  # Start from a pretrained model: a Hugging Face folder (or a model id in
  # its cache) or another workdir. Its model fields replace model's and
  # model_kind (train/init_from.py); None: a fresh model.
  init_from: str | None = None
  lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
  # An unset model.vocab_size is the tokenizer's rounded up to this, so the
  # vocabulary splits over 'tensor'.
  vocab_multiple: int = 8
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  seq_len: int = 128
  batch_size: int = 32
  eval_batch_size: int = 32
  num_steps: int = 600
  log_every: int = 50
  eval_every: int = 200
  eval_steps: int | None = None  # None: the whole validation split
  # Translation: greedy BLEU on this many validation sentences at each eval.
  eval_bleu_examples: int = 0
  checkpoint_every: int = 200
  keep_checkpoints: int = 3
  # The local tier (train/local_tier.py): a directory on each host's own
  # disk (a local SSD, /dev/shm), saved every local_checkpoint_every steps
  # (a divisor of checkpoint_every); a restart resumes from the newest step
  # either tier holds. None: off (only the workdir, every checkpoint_every).
  local_checkpoint_dir: str | None = None
  local_checkpoint_every: int | None = None
  # Peak FLOP/s of one device in TFLOP/s, for MFU in the logs; None: built
  # in for H100/H200/A100/TPU v4-v6 (bf16 dense), no MFU on CPUs.
  peak_tflops: float | None = None
  # Memory of one device in GB (10^9 bytes): a run whose train step needs
  # more is refused before its first step. None: built in for H100/H200/
  # A100/TPU v4-v6 (vendor figures); on CPUs only reported, never refused.
  device_memory_gb: float | None = None
  # Tokens per chunk of the output head and loss (0: all at once). Chunked,
  # float32 logits [B, T, V] never exist in the step: set it (e.g. 4096)
  # when the vocabulary is large.
  loss_chunk_size: int = 0
  # Seconds without a finished step (or evaluation batch, or save) after
  # which the run prints every thread's stack and exits with status 124
  # (runtime/stall.py). None: 20x the longest interval seen, at least
  # 600 s; 0: never. Compiling is not counted.
  step_timeout_s: float | None = None
  profile: ProfileConfig = dataclasses.field(default_factory=ProfileConfig)
  seed: int = 0
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  sample: SampleConfig = dataclasses.field(default_factory=SampleConfig)
  eval_harness: EvalHarnessConfig = dataclasses.field(
      default_factory=EvalHarnessConfig)

  @classmethod
  def of(cls, value: Any) -> Experiment:
    """An Experiment from an Experiment, a ConfigDict (a config file's,
    overridden on the command line) or a dict (a workdir's config.json):
    fields it lacks take their defaults; a misspelt one is refused in one
    sentence naming the closest."""
    return fields.build(cls, value, 'config')

  def to_dict(self) -> dict[str, Any]:
    """Nested dicts of plain values, as a workdir's config.json holds."""
    return fields.to_dict(self)

  def saved_form(self) -> dict[str, Any]:
    """What a workdir's config.json holds: ``to_dict()`` with init_from
    and the data's paths absolute (``experiment.paths``), so that the
    workdir reads the same from any directory."""
    return absolute_paths(self).to_dict()

  def replace(self, **changes: Any) -> Experiment:
    """A copy with top-level fields or parts replaced; a dotted name
    replaces a field of a part: ``replace(**{'optim.z_loss': 1e-4})``."""
    out = self
    for path, value in changes.items():
      out = fields.replace_in(out, path, value)
    return out

  @property
  def source_len(self) -> int:
    """Source tokens per row of an encoder-decoder run (data.src_len, else
    seq_len); 0 for a decoder-only LM."""
    if not families.family(self.model_kind).has_source:
      return 0
    return self.data.src_len or self.seq_len

  @property
  def step_shape(self) -> StepShape:
    """The tokens of one train step's batch."""
    return StepShape(self.batch_size, self.source_len, self.seq_len)

  @property
  def train_batches(self) -> TrainBatches:
    """What the training batches are made from (data.train_iterator)."""
    return TrainBatches(self.data, self.batch_size, self.seq_len, self.seed)

  @property
  def evaluation(self) -> EvalConfig:
    """What the periodic evaluation and the last sample read."""
    return EvalConfig(self.data, self.model_kind,
                      self.eval_batch_size, self.seq_len, self.eval_steps,
                      self.eval_bleu_examples, self.eval_every,
                      self.log_every, self.num_steps, self.sample, self.seed)

  @property
  def optimizer_updates(self) -> int:
    """Optimizer updates of the whole run (steps over accumulation)."""
    return max(self.num_steps // self.optim.grad_accum_steps, 1)

  def model_config(self, tokenizer_vocab: int) -> ModelConfig:
    """model with vocab_size None made the tokenizer's (rounded up to
    vocab_multiple so it splits over 'tensor'); refuses a vocab_size
    smaller than the tokenizer's, and sequences longer than max_len."""
    size = self.model.vocab_size
    if size is None:
      multiple = self.vocab_multiple
      size = -(-tokenizer_vocab // multiple) * multiple
    elif size < tokenizer_vocab:
      raise UsageError(f'config.model.vocab_size={size} is smaller than the '
                       f"tokenizer's {tokenizer_vocab}; raise it, or unset it "
                       "to use the tokenizer's.")
    mc = self.model.replace(vocab_size=size)
    for name, length in (('seq_len', self.seq_len),
                         ('data.src_len', self.data.src_len)):
      if length is not None and length > mc.max_len:
        raise UsageError(f'config.{name}={length} exceeds model.max_len='
                         f'{mc.max_len}; raise max_len or shorten sequences.')
    return mc

  def kept_by_resume(self) -> dict[str, Any]:
    """What a run resuming this one must keep: model_kind, and its model,
    data and LoRA without their runtime fields (LoRA only where it is
    on), as JSON gives them (tuples are lists). Intervals and the other
    top-level fields may change."""
    out = json.loads(json.dumps(self.to_dict()))
    for key, names in (('model', RUNTIME_MODEL_FIELDS),
                       ('data', RUNTIME_DATA_FIELDS)):
      for name in names:
        del out[key][name]
    kept = ('model_kind', 'model', 'data') + (('lora',) if self.lora.rank
                                              else ())
    return {key: out[key] for key in kept}

  def changed_since(self, saved: Experiment) -> str | None:
    """None where this run may resume ``saved``'s workdir, else the part
    that changed and its fields ('model (d_ff)'). Paths are compared
    absolute (an old config.json's relative ones from the current
    directory)."""
    old = absolute_paths(saved).kept_by_resume()
    new = absolute_paths(self).kept_by_resume()
    for key in ('model_kind', 'model', 'data', 'lora'):
      if old.get(key) != new.get(key):
        both = isinstance(old.get(key), dict) and isinstance(new.get(key),
                                                             dict)
        fields = sorted(f for f in old[key] if old[key][f] != new[key][f]
                        ) if both else []
        return key + (f' ({", ".join(fields)})' if fields else '')
    return None

  def check(self) -> None:
    """Refuses in one sentence, before any data is prepared or any step
    compiled, a field no run can use: the run's counts, intervals and
    paths, then each part's own checks (what needs the data room, such as
    a 'files' glob that matches nothing, is ``train.run_plan.checked``).
    """
    for name in POSITIVE_FIELDS:
      _positive_int(name, getattr(self, name))
    chunk = self.loss_chunk_size
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
      raise UsageError('config.loss_chunk_size must be a non-negative '
                       'integer (0: the loss over all tokens at once), got '
                       f'{chunk!r}.')
    if self.eval_bleu_examples < 0:
      raise UsageError('config.eval_bleu_examples must be >= 0 (0 turns the '
                       f'BLEU check off), got {self.eval_bleu_examples!r}.')
    timeout = self.step_timeout_s
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float))
                                or not timeout >= 0):
      raise UsageError('config.step_timeout_s must be a number of seconds >= '
                       f'0 (0: never; None: automatic), got {timeout!r}.')
    if self.init_from is not None and not (isinstance(self.init_from, str)
                                           and self.init_from):
      raise UsageError('config.init_from must name a Hugging Face model '
                       'folder, a model id in its cache or a workdir, got '
                       f'{self.init_from!r}.')
    families.family(self.model_kind)  # UsageError for an unknown kind
    self._check_local_tier()
    self.lora.check()
    if self.lora.rank and not self.init_from:
      raise UsageError(f'config.lora.rank={self.lora.rank} trains adapters '
                       'on a frozen pretrained model: set config.init_from to '
                       'it (it is read again at every start and by '
                       'generate/export).')
    self.optim.check()
    self.profile.check()
    self.data.check()

  def _check_local_tier(self) -> None:
    """The local tier's fields: both or neither, an interval dividing
    checkpoint_every (so the tiers' steps line up). Its directory's place
    (not inside the workdir, not shared by hosts) is checked at the start
    (``train.local_tier``)."""
    every, where = self.local_checkpoint_every, self.local_checkpoint_dir
    if where is not None and not isinstance(where, str):
      raise UsageError('config.local_checkpoint_dir must be a directory on '
                       f'each host\'s own disk, got {where!r}.')
    if every is None and not where:
      return
    if not where:
      raise UsageError(f'config.local_checkpoint_every={every} needs '
                       'config.local_checkpoint_dir, a directory on each '
                       'host\'s own disk (a local SSD, /dev/shm).')
    if every is None:
      raise UsageError(f'config.local_checkpoint_dir={where} needs '
                       'config.local_checkpoint_every, the steps between '
                       'saves to it (a divisor of checkpoint_every).')
    _positive_int('local_checkpoint_every', every)
    if self.checkpoint_every % every:
      raise UsageError(f'config.local_checkpoint_every={every} does not '
                       'divide config.checkpoint_every='
                       f'{self.checkpoint_every}: the tiers\' steps must '
                       'line up; pick a divisor.')


def _positive_int(name: str, value: Any) -> None:
  fields.check_integer(f'config.{name}', value)


def base_config() -> ConfigDict:
  """The default Experiment as the ConfigDict a config file starts from
  and the command line overrides (``fields.to_config_dict``)."""
  return fields.to_config_dict(Experiment())
