"""Side-by-side benchmarks behind ``scripts/benchmark.py``.

One module per suite (``step``: our jitted train step and forward against
PyTorch; ``nanogpt``: the default job against nanoGPT; ``gpu``: bf16
throughput and MFU; ``pipeline``: the input pipeline's sustained rate), and
``timing`` for what they share: interleaved rounds, medians, machine load;
``rows`` streams result rows as JSON lines.
Importing a suite may import torch; nothing else in the package imports this.
"""
