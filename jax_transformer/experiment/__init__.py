"""The typed experiment: every setting of a training run, its default and
its check, without JAX (config files read it before JAX starts).

``run`` (:class:`Experiment`, :func:`base_config`), ``data``
(:class:`DataConfig`), ``data_options`` (each kind of source's own fields
and paths), ``paths``, ``parts`` (LoRA, mesh, optimizer, sample, profile,
a step's shape, the training batches, the evaluation).
"""

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
from jax_transformer.experiment.run import Experiment, base_config

__all__ = ['DataConfig', 'EvalConfig', 'EvalHarnessConfig', 'Experiment', 'LoraConfig',
           'MeshConfig', 'OptimConfig', 'ProfileConfig', 'SampleConfig',
           'StepShape', 'TrainBatches', 'base_config']
