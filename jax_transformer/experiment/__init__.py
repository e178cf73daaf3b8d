"""The typed experiment: every setting of a training run, its default and
its check, without JAX (config files read it before JAX starts).

``run`` (:class:`Experiment`, :func:`base_config`), ``data``
(:class:`DataConfig`), ``parts`` (LoRA, mesh, optimizer, sample, profile,
a step's shape).
"""

from jax_transformer.experiment.data import DataConfig
from jax_transformer.experiment.parts import (
  LoraConfig,
  MeshConfig,
  OptimConfig,
  ProfileConfig,
  SampleConfig,
  StepShape,
)
from jax_transformer.experiment.run import Experiment, base_config

__all__ = ['DataConfig', 'Experiment', 'LoraConfig', 'MeshConfig',
           'OptimConfig', 'ProfileConfig', 'SampleConfig', 'StepShape',
           'base_config']
