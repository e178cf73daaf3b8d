"""Input pipeline: TFDS builders, tokenizers, batching/packing, Grain iterators.

Typical use (see docs/data.md)::

  from jax_transformer import data
  prepared = data.prepare('shakespeare')               # build once, cheap after
  prepared = data.prepare_for(cfg.data)   # the same from a run's data config
  it = data.make_iterator({'name': 'shakespeare'}, 'train', prepared.tokenizer,
                          batch_size=64, seq_len=256, seed=0)
  batch = next(it)  # inputs, targets, segment_ids, positions: [64, 256]

Modules, bottom to top: ``tokenizers``, ``batching`` (example layouts and
packing), ``downloads`` (TFDS downloads without TensorFlow), the builders
(``shakespeare``, ``ding``, ``lm1b``, ``wmt``; ``builders`` picks one by
name; ``files`` your own files, ``hf_datasets`` Hugging Face datasets),
``datasets`` (the dataset table, reading and preparing a spec),
``splits`` (one split as Grain batches), ``sources`` (one class per kind
of source: built-in, TFDS, files, Hugging Face, mixture; the door
``source_for``/``spec_for``/``prepare_for``), ``pipeline`` (the door
``make_iterator``).
"""

from jax_transformer.data.batching import (
                                           lm_example,
                                           lm_layout,
                                           lm_prompt,
                                           translation_example,
                                           translation_layout,
                                           translation_source,
)
from jax_transformer.data.datasets import (
                                           DATASETS,
                                           DatasetSpec,
                                           PreparedData,
                                           default_data_dir,
                                           get_spec,
                                           load_source,
                                           prepare,
)
from jax_transformer.data.pipeline import (
                                           check_config,
                                           global_batch,
                                           initial_state,
                                           make_dataset,
                                           make_iterator,
                                           train_iterator,
                                           training_preflight,
)
from jax_transformer.data.sources import (
                                           prepare_for,
                                           source_for,
                                           spec_for,
)
from jax_transformer.data.tokenizers import (
                                           BOS_ID,
                                           EOS_ID,
                                           PAD_ID,
                                           UNK_ID,
                                           ByteTokenizer,
                                           HuggingFaceTokenizer,
                                           SentencePieceTokenizer,
                                           load_tokenizer,
)
from jax_transformer.experiment.data import DataConfig

__all__ = [
    'BOS_ID', 'ByteTokenizer', 'DATASETS', 'DataConfig', 'DatasetSpec',
    'check_config',
    'EOS_ID', 'HuggingFaceTokenizer', 'PAD_ID', 'PreparedData',
    'SentencePieceTokenizer', 'UNK_ID', 'default_data_dir', 'get_spec',
    'global_batch', 'initial_state', 'lm_example', 'lm_layout',
    'load_source', 'load_tokenizer', 'lm_prompt', 'make_dataset',
    'make_iterator', 'prepare', 'prepare_for', 'source_for', 'spec_for',
    'train_iterator',
    'training_preflight', 'translation_example',
    'translation_layout', 'translation_source',
]
