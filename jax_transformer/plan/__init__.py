"""The run planner (``scripts/plan.py``, docs/planning.md).

``candidates`` (the layouts a run could take on a set of chips),
``search`` (pruning, compiling within a budget, the cache, the ranking),
``measure`` (the model against measured steps on the devices at hand).
Compiling and the step-time model are ``jax_transformer.compile``'s.
"""
