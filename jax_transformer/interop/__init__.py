"""PyTorch and Hugging Face in both directions.

``torch_compat`` (parameter name and layout tables, PyTorch's mask
convention), ``torch_reference`` (the same models written in PyTorch, for
parity tests and exports), ``exporter`` (a workdir to a PyTorch state dict,
safetensors or a Hugging Face folder), ``importer`` (those files into a new
workdir), ``hf_tokenizer`` (a workdir's tokenizer for ``transformers``).
"""
