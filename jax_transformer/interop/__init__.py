"""PyTorch and Hugging Face formats, below training.

``torch_compat`` (parameter name and layout tables, PyTorch's mask
convention), ``torch_layouts`` (each model family's PyTorch layout, by the
name its record gives), ``torch_reference`` (the same models written in
PyTorch, for parity tests and exports), ``hf_families`` (the Hugging Face families'
tensor tables: GPT-2, Llama, Mistral, Qwen2), ``hf_checkpoint`` (a Hugging
Face model folder read as a source of weights), ``hf_export`` (parameters
to a Hugging Face folder), ``hf_tokenizer`` (a tokenizer for
``transformers``). Whole workdirs in and out are ``jax_transformer.workdirs``'.
"""
