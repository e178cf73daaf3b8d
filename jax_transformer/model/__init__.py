"""The two Transformers and their parts, importing nothing above them.

``config`` (the frozen ``ModelConfig`` and presets), ``masks`` (one mask
convention: True may attend), ``layers`` (embeddings, norms, feed-forward),
``attention`` (multi-head attention and the KV cache), ``blocks`` (encoder
and decoder layers), ``stack`` (layers in a loop or scanned), ``models``
(``EncoderDecoder``, ``DecoderLM``), ``families`` (each model kind as one
record: class, batch-to-call, source side, export layout), ``params``
(graph definition and parameter pytree, scanned and per-layer layouts),
``sharding`` (logical axis names to mesh axes).
"""
