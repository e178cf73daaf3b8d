"""What a run needs from the machines it runs on, independent of the model.

``storage`` (local and ``gs://`` paths, one resolved ``WorkdirPaths``),
``distributed`` (several processes with ``jax.distributed``), ``liveness``
(heartbeats that notice a lost process), ``host_memory`` (the host's RAM).
"""
