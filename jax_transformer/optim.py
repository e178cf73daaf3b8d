"""Learning-rate schedules and the optimizer, assembled from Optax pieces."""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax


def rsqrt_schedule(d_model: int, warmup_steps: int,
                   scale: float = 1.0) -> optax.Schedule:
  """The paper's schedule: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

  Optax counts updates from 0; the paper's step is that count plus one.
  """
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model ** -0.5 * jnp.minimum(
        step ** -0.5, step * warmup_steps ** -1.5)
  return schedule


def make_schedule(cfg: Mapping[str, Any], d_model: int,
                  num_steps: int) -> optax.Schedule:
  """From an optimizer config: 'rsqrt', 'warmup_cosine' or 'constant'.

  num_steps and cfg['warmup_steps'] count train steps (micro-batches);
  the schedule is evaluated per optimizer update, which under gradient
  accumulation comes every grad_accum_steps of them, so both are converted
  to updates: a run ends at the schedule's end whatever the accumulation.
  """
  kind = cfg['schedule']
  if kind not in ('rsqrt', 'warmup_cosine', 'constant'):
    raise ValueError(f"optim.schedule must be 'rsqrt', 'warmup_cosine' or "
                     f"'constant', got {kind!r}.")
  accum = int(cfg.get('grad_accum_steps', 1))
  num_steps = max(num_steps // accum, 1)
  warmup = int(cfg['warmup_steps']) // accum
  if kind == 'rsqrt':
    return rsqrt_schedule(d_model, max(warmup, 1), cfg.get('lr_scale', 1.0))
  lr = float(cfg['learning_rate'])
  if kind == 'warmup_cosine':
    return optax.warmup_cosine_decay_schedule(
        0.0, lr, warmup, max(num_steps, warmup + 1),
        end_value=lr * float(cfg.get('final_lr_fraction', 0.1)))
  # Constant after a linear warmup.
  return optax.linear_schedule(0.0, lr, warmup) if warmup else (
      optax.constant_schedule(lr))


def decay_mask(params: Mapping[str, jax.Array]) -> dict[str, bool]:
  """Weight decay on matrices only: never on norms, biases (ndim < 2)."""
  return {k: len(v.shape) >= 2 for k, v in params.items()}


def make_optimizer(cfg: Mapping[str, Any], schedule: optax.Schedule,
                   params: Mapping[str, jax.Array]
                   ) -> optax.GradientTransformation:
  """Clipping, then Adam or AdamW, wrapped for gradient accumulation.

  ``params`` may be abstract (ShapeDtypeStructs): only shapes are read.
  """
  kind = cfg['optimizer']
  adam_args = dict(b1=float(cfg['b1']), b2=float(cfg['b2']),
                   eps=float(cfg['eps']))
  if kind == 'adam':
    opt = optax.adam(schedule, **adam_args)
  elif kind == 'adamw':
    opt = optax.adamw(schedule, weight_decay=float(cfg['weight_decay']),
                      mask=decay_mask(params), **adam_args)
  else:
    raise ValueError(f"optim.optimizer must be 'adam' or 'adamw', got "
                     f"{kind!r}.")
  parts = []
  if cfg.get('clip_norm'):
    parts.append(optax.clip_by_global_norm(float(cfg['clip_norm'])))
  tx = optax.chain(*parts, opt)
  steps = int(cfg.get('grad_accum_steps', 1))
  if steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=steps)
  return tx
