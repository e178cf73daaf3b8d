"""Compiling a run's steps for a target, from any host, without running
them (``scripts/compile_at_size.py``, ``train.py --aot_target``, the
planner).

``lowering`` (the one function that lowers the real train step for given
devices: ``lower_train``), ``report`` (the train, eval and decode steps
compiled by a target's compiler, and what it says), ``hlo_stats`` (what
an optimized HLO module says, counted per step), ``step_model`` (a train
step's predicted time and MFU from its executable: the one model the target
report and the planner share), ``topology`` (a target's compile-only
devices), ``prove`` (the CPU size and depth proofs),
``flags`` (the command-line flags of compiling for a target, defined
once).
"""
