"""Learning-rate schedules and the optimizer, assembled from Optax pieces."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_transformer.experiment.parts import OptimConfig


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


def build(config: OptimConfig, d_model: int, num_steps: int,
          params: Mapping[str, jax.Array]
          ) -> tuple[optax.Schedule, optax.GradientTransformationExtraArgs]:
  """(schedule, optimizer) of a run of num_steps train steps on a model
  of width d_model whose trained parameters are ``params`` (shapes
  only: abstract ShapeDtypeStructs will do)."""
  schedule = make_schedule(config, d_model, num_steps)
  return schedule, make_optimizer(config, schedule, params)


def make_schedule(config: OptimConfig, d_model: int, num_steps: int
                  ) -> optax.Schedule:
  """num_steps and warmup_steps count train steps (micro-batches); the
  schedule is evaluated per optimizer update, which under gradient
  accumulation comes every grad_accum_steps of them, so both are
  converted to updates: a run ends at the schedule's end whatever the
  accumulation."""
  config.check()
  accum = config.grad_accum_steps
  num_steps = max(num_steps // accum, 1)
  warmup = config.warmup_steps // accum
  if config.schedule == 'rsqrt':
    return rsqrt_schedule(d_model, max(warmup, 1), config.lr_scale)
  lr = float(config.learning_rate)
  if config.schedule == 'warmup_cosine':
    return optax.warmup_cosine_decay_schedule(
        0.0, lr, warmup, max(num_steps, warmup + 1),
        end_value=lr * float(config.final_lr_fraction))
  # Constant after a linear warmup.
  return optax.linear_schedule(0.0, lr, warmup) if warmup else (
      optax.constant_schedule(lr))


def make_optimizer(config: OptimConfig, schedule: optax.Schedule,
                   params: Mapping[str, jax.Array]
                   ) -> optax.GradientTransformationExtraArgs:
  """Clipping, then Adam or AdamW; accumulated per token over
  grad_accum_steps micro-batches when that is above 1; non-finite
  updates dropped and counted (``skip_non_finite``).

  ``params`` may be abstract (ShapeDtypeStructs): only shapes are read.
  Its update takes the keyword arguments ``loss`` and ``tokens`` (see
  ``skip_non_finite`` and ``accumulate_per_token``).
  """
  config.check()
  adam_args = dict(b1=float(config.b1), b2=float(config.b2),
                   eps=float(config.eps))
  if config.optimizer == 'adam':
    opt = optax.adam(schedule, **adam_args)
  else:
    opt = optax.adamw(schedule, weight_decay=float(config.weight_decay),
                      mask=decay_mask(params), **adam_args)
  parts = []
  if config.clip_norm:
    parts.append(optax.clip_by_global_norm(float(config.clip_norm)))
  tx = optax.chain(*parts, opt)
  if config.grad_accum_steps > 1:
    tx = accumulate_per_token(tx, config.grad_accum_steps)
  if config.max_skipped_updates > 0:
    return skip_non_finite(tx)
  # Without skipping the state is the optimizer's own, as in checkpoints
  # written before skipping existed: they resume.
  return optax.with_extra_args_support(tx)


def decay_mask(params: Mapping[str, jax.Array]) -> dict[str, bool]:
  """Weight decay on matrices only: never on norms, biases (ndim < 2)."""
  return {k: len(v.shape) >= 2 for k, v in params.items()}


def _select(pred: jax.Array, new: Any, old: Any) -> Any:
  """new where pred else old, leaf by leaf (trees of one structure).

  A select, not a lax.cond: on XLA:GPU a cond copies its predicate to the
  host every step, while computing both sides costs one elementwise pass.
  """
  return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


class AccumulationState(NamedTuple):
  """State of ``accumulate_per_token``."""
  micro_step: jax.Array  # int32 []: micro-batches accumulated so far
  grad_sum: Any          # float32, params' tree: sum of gradient x tokens
  tokens: jax.Array      # float32 []: their target tokens
  inner: Any             # the wrapped optimizer's state


def accumulate_per_token(inner: optax.GradientTransformation, every: int
                         ) -> optax.GradientTransformationExtraArgs:
  """Gradient accumulation over ``every`` micro-batches, weighted per token.

  update(grads, state, params, tokens=n) takes one micro-batch's gradient
  of its loss per target token and that micro-batch's n target tokens
  (float32 []). The every-th call hands ``inner`` sum(g_i n_i) / sum(n_i):
  the gradient of the loss per token of the micro-batches taken together,
  which one step on their concatenation would take (and whose norm
  clipping then sees). The other calls return zero updates and leave
  inner's state alone. Without ``tokens`` every micro-batch weighs one.
  """
  inner = optax.with_extra_args_support(inner)

  def init(params):
    return AccumulationState(
        micro_step=jnp.zeros([], jnp.int32),
        grad_sum=optax.tree.zeros_like(params, dtype=jnp.float32),
        tokens=jnp.zeros([], jnp.float32), inner=inner.init(params))

  def update(grads, state, params=None, *, tokens=None, **extra_args):
    del extra_args  # per micro-batch: nothing for the whole batch's step
    n = jnp.asarray(1.0 if tokens is None else tokens, jnp.float32)
    grad_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32) * n,
                            state.grad_sum, grads)
    total = state.tokens + n
    last = state.micro_step == every - 1
    mean = jax.tree.map(
        lambda s, g: (s / jnp.maximum(total, 1.0)).astype(g.dtype),
        grad_sum, grads)
    updates, inner_state = inner.update(mean, state.inner, params)
    zeros = optax.tree.zeros_like(updates)
    return _select(last, updates, zeros), AccumulationState(
        micro_step=jnp.where(last, 0, state.micro_step + 1),
        grad_sum=_select(last, optax.tree.zeros_like(grad_sum), grad_sum),
        tokens=jnp.where(last, 0.0, total),
        inner=_select(last, inner_state, state.inner))

  return optax.GradientTransformationExtraArgs(init, update)


# The counters of ``skip_non_finite``, which the train step reports.
SKIP_COUNTERS = ('consecutive_skips', 'skipped_updates')


class SkipState(NamedTuple):
  """State of ``skip_non_finite``."""
  consecutive_skips: jax.Array  # int32 []: updates dropped since the last
                                # applied one
  skipped_updates: jax.Array    # int32 []: updates dropped since step 0
  inner: Any                    # the wrapped optimizer's state


def skip_non_finite(inner: optax.GradientTransformation, skip: bool = True
                    ) -> optax.GradientTransformationExtraArgs:
  """Drops an update whose loss or gradient norm is not finite.

  update(grads, state, params, loss=l, **extra) passes ``extra`` on to
  ``inner``; ``loss`` (the step's loss, any shape) is optional. A dropped
  update returns zero updates and leaves inner's state as it was (under
  ``accumulate_per_token`` that micro-batch never happened); it is counted
  in both counters, and an applied update resets consecutive_skips. When to
  give up is the caller's decision (see trainer.check_finite).

  skip=False: ``inner`` alone, every update applied and the counters kept
  at 0, for a run that stops at the first non-finite step; its state has
  the same structure, so a checkpoint of one resumes with the other.
  """
  inner = optax.with_extra_args_support(inner)

  def init(params):
    zero = jnp.zeros([], jnp.int32)
    return SkipState(zero, zero, inner.init(params))

  def update(grads, state, params=None, *, loss=None, **extra_args):
    updates, inner_state = inner.update(grads, state.inner, params,
                                        **extra_args)
    if not skip:
      # Selecting the state, even where nothing is dropped, changes how XLA
      # fuses the update and so its last bits: off, the step is inner's own.
      return updates, state._replace(inner=inner_state)
    ok = jnp.isfinite(optax.tree.norm(grads))
    if loss is not None:
      ok &= jnp.all(jnp.isfinite(loss))
    dropped = jnp.where(ok, 0, 1).astype(jnp.int32)
    return _select(ok, updates, optax.tree.zeros_like(updates)), SkipState(
        consecutive_skips=(state.consecutive_skips + 1) * dropped,
        skipped_updates=state.skipped_updates + dropped,
        inner=_select(ok, inner_state, state.inner))

  return optax.GradientTransformationExtraArgs(init, update)


def skip_counts(opt_state: Any) -> dict[str, jax.Array]:
  """The counters of ``skip_non_finite`` in an optimizer state made by
  ``make_optimizer`` ({} for any other optimizer's)."""
  if not isinstance(opt_state, SkipState):
    return {}
  return {name: getattr(opt_state, name) for name in SKIP_COUNTERS}
