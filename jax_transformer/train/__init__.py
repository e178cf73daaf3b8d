"""Training and everything that reads what training wrote.

``experiment`` (an experiment config into a model and optimizer),
``optim`` (Optax schedules and optimizers), ``losses`` (chunked cross
entropy as (sum, count) pairs), ``steps`` (the pure jitted train and eval
steps), ``trainer`` (the loop: data, steps, checkpoints, signals),
``evaluation`` (loss, perplexity and BLEU), ``metrics`` (``metrics.jsonl``
and TensorBoard), ``checkpoint`` (Orbax, with torn-checkpoint fallback),
``restore`` (a trained workdir opened for evaluation, decoding, export),
``memory`` (the pre-flight memory estimate), ``perf`` (FLOPs and MFU).
Compiling a step for a target without running it is
``jax_transformer.compile``'s.
"""
