"""A training workdir seen from outside the run that wrote it.

``restore`` (a trained workdir opened for evaluation, decoding and export:
its config, tokenizer and parameters on a mesh of this host's devices),
``exporter`` (a workdir to a PyTorch state dict, safetensors or a Hugging
Face folder), ``importer`` (those files, or a Hugging Face folder, into a
new workdir that train.py resumes).
"""
