"""Scoring a language model the way the field does: lm-evaluation-harness
tasks over this project's decoder LMs.

By file: ``backend`` (:class:`JaxTransformerLM`, lm-eval's model API,
registered as ``jax_transformer``), ``scoring`` (continuations'
log-likelihoods, batched in length buckets over the mesh), ``generation``
(``generate_until`` through the KV-cached decoder), ``tasks`` (running
tasks: offline checks, the results table and files), ``during_training``
(the trainer's hook). ``tasks/`` holds the bundled local tasks.

Needs the ``eval`` extra (``pip install -e '.[eval]'``: lm-eval).
"""

from jax_transformer.harness.backend import JaxTransformerLM  # noqa: F401
