"""Every dataset builder this package knows, and the one to use for a name.

Importing this module imports the builder classes, which registers their
names: ``ding_en_de`` and ``shakespeare`` with TFDS, and the TF-free
subclasses of TFDS's lm1b and WMT builders in
``downloads.TF_FREE_BUILDERS`` (TFDS keeps its own class for those names,
which ``tfds.data_source`` uses to read the files).
"""

from __future__ import annotations

from typing import Any

import tensorflow_datasets as tfds

from jax_transformer.data import ding, lm1b, shakespeare, wmt
from jax_transformer.data.downloads import TF_FREE_BUILDERS

# The modules above are imported for their registrations.
REGISTERED = (ding, lm1b, shakespeare, wmt)


def builder(name: str, **kwargs: Any) -> tfds.core.DatasetBuilder:
  """``tfds.builder(name, **kwargs)``, with our TF-free class where we have one.

  ``name`` may carry a config and version (``'wmt14_translate/de-en:1.0.0'``).
  """
  ds_name, parsed = tfds.core.naming.parse_builder_name_kwargs(name, **kwargs)
  cls = TF_FREE_BUILDERS.get(ds_name.name)
  if cls is None or ds_name.namespace:
    return tfds.builder(name, **kwargs)
  return cls(**parsed)
