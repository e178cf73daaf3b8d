"""The run planner (``scripts/plan.py``, docs/planning.md).

``candidates`` (the layouts a run could take on a set of chips),
``step_model`` (a train step's time from its compiled executable),
``search`` (pruning, compiling within a budget, the cache, the ranking),
``measure`` (the model against measured steps on the devices at hand).
"""
