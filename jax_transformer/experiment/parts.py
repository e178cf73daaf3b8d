"""The parts of an experiment, each a frozen dataclass with its defaults
and its checks (``config.lora``, ``config.mesh``, ``config.optim``,
``config.sample``, ``config.profile``; ``config.model`` is
``model.config.ModelConfig`` and ``config.data`` is ``data.DataConfig``).

Read before JAX starts (a target's compiler must start first), so nothing
here imports it; what each part builds is built in its own room:
``optim.build(config.optim, ...)``, ``lora.apply(config.lora, ...)``,
``sharding.make_mesh(config.mesh.sizes, ...)``. Beside them, the views a
room reads instead of the whole experiment: ``StepShape`` (figures),
``TrainBatches`` (the data room), ``EvalConfig`` (evaluation).
"""

from __future__ import annotations

import dataclasses

from jax_transformer import fields
from jax_transformer.errors import UsageError
from jax_transformer.experiment.data import DataConfig
from jax_transformer.model import families


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """``config.lora`` (docs/finetune.md): rank 0 is off; above 0, only
  adapters on the kernels ``targets`` names train (patterns: 'query',
  'attention', 'mlp', 'layers.*.ff.wi', or Hugging Face module names:
  'q_proj', 'c_attn', ...), scaled by alpha / rank, and only they are in
  the optimizer and in checkpoints: the frozen base is read from
  ``config.init_from`` at every start. dropout: the rate at which the
  adapters' input is dropped in training (PEFT's lora_dropout)."""
  rank: int = 0
  alpha: float = 16.0
  targets: str = 'query,key,value,out'
  dropout: float = 0.0

  def check(self) -> None:
    """Refuses in one sentence a rank below 0 or, with LoRA on, an alpha
    that is not positive or a dropout outside [0, 1) (the targets are
    checked against the model)."""
    rank = fields.check_integer('config.lora.rank', self.rank, 0, ' (0: off)')
    alpha = self.alpha
    if rank and (isinstance(alpha, bool) or not isinstance(
        alpha, (int, float)) or not alpha > 0):
      raise UsageError(f'config.lora.alpha must be a positive number, got '
                       f'{alpha!r}.')
    dropout = self.dropout
    if isinstance(dropout, bool) or not isinstance(
        dropout, (int, float)) or not 0 <= dropout < 1:
      raise UsageError('config.lora.dropout must be a number in [0, 1) (0: '
                       f'none), got {dropout!r}.')


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """``config.mesh``: devices as data x fsdp x sequence x tensor (one -1:
  the rest).

  sequence splits each row's positions (context parallelism: attention
  gathers keys and values over it; docs/scaling.md, "Long rows"); the
  batch splits over data x fsdp only. Over several TPU slices (GPU hosts)
  only data and fsdp cross the slow network between them: dcn_data x
  dcn_fsdp parts of those axes, one per slice (host); both 0 puts data
  across first, then fsdp (:func:`make_mesh`).
  """
  data: int = -1
  fsdp: int = 1
  sequence: int = 1
  tensor: int = 1
  dcn_data: int = 0
  dcn_fsdp: int = 0

  @property
  def sizes(self) -> dict[str, int]:
    return dataclasses.asdict(self)


SCHEDULES = ('rsqrt', 'warmup_cosine', 'constant')
OPTIMIZERS = ('adam', 'adamw')


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """``config.optim``: the optimizer, its schedule and the loss's options.

  Attributes:
    optimizer: 'adam' or 'adamw' (decoupled weight decay on matrices).
    schedule: 'rsqrt' (the paper's: d_model^-0.5 * min(step^-0.5, step *
      warmup^-1.5) * lr_scale), 'warmup_cosine' (to final_lr_fraction of
      learning_rate at the last step) or 'constant' (after the warmup).
    warmup_steps: train steps of linear warmup (the paper's warmup for
      'rsqrt').
    clip_norm: the global gradient norm clipped to (0: none).
    grad_accum_steps: micro-batches accumulated, per token, into one
      update; steps and warmup count micro-batches.
    label_smoothing / z_loss: the loss's (``losses.py``).
    max_skipped_updates: updates with a non-finite loss or gradient norm
      are skipped (parameters and optimizer state kept); training stops at
      the first (0) or after this many in a row.
  """
  optimizer: str = 'adamw'
  schedule: str = 'warmup_cosine'
  learning_rate: float = 2e-3
  warmup_steps: int = 50
  final_lr_fraction: float = 0.1
  lr_scale: float = 1.0
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-9
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  grad_accum_steps: int = 1
  label_smoothing: float = 0.0
  z_loss: float = 0.0
  max_skipped_updates: int = 0

  def check(self) -> None:
    """Refuses in one sentence a value no optimizer can take."""
    if self.optimizer not in OPTIMIZERS:
      raise UsageError(f'config.optim.optimizer must be one of {OPTIMIZERS}, '
                       f'got {self.optimizer!r}.')
    if self.schedule not in SCHEDULES:
      raise UsageError(f'config.optim.schedule must be one of {SCHEDULES}, '
                       f'got {self.schedule!r}.')
    for name, least, meaning in (
        ('grad_accum_steps', 1, ''), ('warmup_steps', 0, ''),
        ('max_skipped_updates', 0,
         ' (0: stop at the first non-finite step)')):
      fields.check_integer(f'config.optim.{name}', getattr(self, name),
                           least, meaning)


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  """``config.sample``: the sample a finished run ends with (an LM
  continues ``prompt``; a translation model translates it)."""
  enabled: bool = True
  prompt: str = 'ROMEO:'
  max_new_tokens: int = 200
  temperature: float = 0.8
  top_k: int = 40


@dataclasses.dataclass(frozen=True)
class EvalHarnessConfig:
  """``config.eval_harness``: lm-evaluation-harness tasks scored during
  training (``jax_transformer.harness``; the ``eval`` extra), their metrics
  in the evaluation's rows as ``harness/<task>/<metric>``. tasks: names,
  comma-separated ('': none); every: steps between scorings (None: every
  eval_every, and the last step); limit: documents per task (a count, or a
  fraction < 1); num_fewshot: None, the task's; include_path: a folder of
  task YAMLs; batch_size: None, the run's eval_batch_size."""
  tasks: str = ''
  every: int | None = None
  limit: float | None = None
  num_fewshot: int | None = None
  include_path: str | None = None
  batch_size: int | None = None


@dataclasses.dataclass(frozen=True)
class StepShape:
  """The tokens of one train step's batch (``Experiment.step_shape``):
  what FLOPs, memory and step-time figures are counted from."""
  batch_size: int   # rows per step, over all devices
  source_len: int   # source tokens per row (0: a decoder-only LM)
  seq_len: int      # target tokens per row


@dataclasses.dataclass(frozen=True)
class TrainBatches:
  """The training batches of a run (``Experiment.train_batches``): data's
  train split in batch_size rows of seq_len tokens, shuffled by seed."""
  data: DataConfig
  batch_size: int
  seq_len: int
  seed: int


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """What a run's evaluations and its last sample read
  (``Experiment.evaluation``): after every ``every``-th logged step (and
  the last, ``num_steps``) the loss over ``max_batches`` (None: all)
  batches of ``batch_size`` rows of ``seq_len`` tokens of data's
  evaluation split, for a model with a source side (translation) greedy
  BLEU on its first
  ``bleu_examples`` sentences; at the end ``sample``, seeded by seed."""
  data: DataConfig
  model_kind: str  # a key of model.families.FAMILIES
  batch_size: int
  seq_len: int
  max_batches: int | None
  bleu_examples: int
  every: int
  log_every: int
  num_steps: int
  sample: SampleConfig
  seed: int

  @property
  def family(self) -> families.Family:
    """The record of the run's model kind."""
    return families.family(self.model_kind)

  def due(self, step: int) -> bool:
    """Whether step is evaluated after it (every ``every``, and the
    last); a step not logged (log_every) is not."""
    last = step == self.num_steps
    logged = step % self.log_every == 0 or last
    return step > 0 and logged and (step % self.every == 0 or last)


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
  """``config.profile``: a trace of steps start_step .. start_step +
  num_steps - 1 under WORKDIR/tensorboard/ (0 steps: none)."""
  start_step: int = 0
  num_steps: int = 0

  def check(self) -> None:
    for name in ('start_step', 'num_steps'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f'config.profile.{name} must be a non-negative '
                         f'integer, got {value!r}.')
    if self.num_steps and not self.start_step:
      raise UsageError('config.profile.num_steps is set: set '
                       'config.profile.start_step to the first step to '
                       'trace (steps count from 1).')
