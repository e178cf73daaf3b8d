"""What each kind of data source reads of ``config.data`` as its own: its
fields, and which of them are paths.

The kinds themselves (``data/sources.py``: ``BuiltIn``, ``Files``,
``HuggingFace``, ``Tfds``, ``Mixture``) read datasets, so they sit above
the experiment; each names its ``Options`` here (``Source.options``), one
layer down, so that what the experiment derives from them needs no data
code: the fields a mixture's part may set (``part_fields``) and the paths
a workdir's config.json stores absolute (``path_fields``,
``experiment.paths``). A new kind adds its record to ``KINDS`` and names
it from its class; ``tests/data/test_source_options.py`` keeps the two
lists one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

# How a path field is made absolute (``experiment.paths``):
FOLDER = 'folder'  # always, against the current directory: it is made
EXISTING = 'existing'  # where it exists (else, e.g. a model id, as it is)
GLOBS = 'globs'  # comma-separated globs, each local one


@dataclasses.dataclass(frozen=True)
class Options:
  """The fields of ``config.data`` that one kind of source reads as its own.

  Attributes:
    kind: the kind's key in ``sources.KINDS``.
    fields: its own fields (a mixture's part may set them).
    paths: of its fields, those naming a local path or a URL, each with
      how it is made absolute (FOLDER, EXISTING or GLOBS).
  """
  kind: str
  fields: tuple[str, ...] = ()
  paths: Mapping[str, str] = dataclasses.field(
      default_factory=lambda: MappingProxyType({}))

  def __post_init__(self):
    stray = sorted(set(self.paths) - set(self.fields))
    if stray:  # a path the kind does not own could not be set on it
      raise ValueError(f'{self.kind}: paths {stray} are not among its fields.')


# Read by every kind that ends as a TFDS dataset on disk (all but the
# mixture): where it is, which way round, its splits and its builder.
DATASET = Options('dataset', (
    'name', 'data_dir', 'direction', 'pack', 'src_len', 'builder_kwargs',
    'train_split', 'eval_split'), {'data_dir': FOLDER})

# task, text_key and lm_mode: what a dataset outside the table must be
# told, and what a built-in's row may be overridden with.
_SPEC = ('task', 'text_key', 'lm_mode')

BUILTIN = Options('builtin', _SPEC)
TFDS = Options('tfds', _SPEC)
FILES = Options('files', _SPEC + ('train_files', 'eval_files',
                                  'eval_fraction'),
                {'train_files': GLOBS, 'eval_files': GLOBS})
HUGGINGFACE = Options('huggingface', _SPEC + ('hf_config', 'hf_path'),
                      {'hf_path': EXISTING})
# The mixture's parts are dicts of the fields above, each with these two.
MIXTURE = Options('mixture', ('mixture',))
PART = ('weight', 'label')

# Fields of the run alone: its tokenizer (every part of a mixture is read
# with it) and how its batches are made.
RUN = Options('run', (
    'tokenizer', 'vocab_size', 'spm_model_type', 'tokenizer_path',
    'chat_train', 'prepare_workers', 'worker_count', 'worker_buffer_size',
    'accept_changed_corpus'), {'tokenizer_path': EXISTING})

KINDS = (MIXTURE, BUILTIN, FILES, HUGGINGFACE, TFDS)


def part_fields() -> tuple[str, ...]:
  """What a mixture's part may set: a dataset's fields, every kind's own
  (but the mixture's), its weight and its label."""
  own = [f for o in KINDS if o is not MIXTURE for f in o.fields]
  return tuple(dict.fromkeys(('name',) + PART + DATASET.fields + tuple(own)))


def path_fields() -> dict[str, str]:
  """Every path field of ``config.data`` (the run's, the dataset's, each
  kind's), with how it is made absolute."""
  out: dict[str, str] = {}
  for options in (RUN, DATASET) + KINDS:
    out.update(options.paths)
  return out
