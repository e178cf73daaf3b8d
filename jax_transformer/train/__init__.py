"""Training.

``model_setup`` (an experiment into a model and optimizer), ``run_plan``
(the run planned once: mesh, sharded state, jitted steps), ``init_from``
(a run starting from pretrained weights),
``optim`` (Optax schedules and optimizers), ``losses`` (chunked cross
entropy as (sum, count) pairs), ``steps`` (the pure jitted train and eval
steps), ``trainer`` (the loop: data, steps, checkpoints, signals),
``scores`` (loss, perplexity and BLEU of a model on a split),
``evaluating`` (the trainer's periodic evaluation and sample), ``metrics``
(``metrics.jsonl`` and TensorBoard), ``checkpoint`` (Orbax, with
torn-checkpoint fallback), ``memory`` (the pre-flight memory estimate),
``perf`` (FLOPs and MFU). Compiling a step for a target without running it is
``jax_transformer.compile``'s.
"""
