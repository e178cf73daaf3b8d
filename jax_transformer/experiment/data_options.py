"""What each kind of data source reads of ``config.data`` as its own: its
fields (a kind's own group of them nested under it: ``config.data.files``,
``config.data.hf``), and which of them are paths.

The kinds themselves (``data/sources.py``: ``BuiltIn``, ``Files``,
``HuggingFace``, ``Tfds``, ``Mixture``) read datasets, so they sit above
the experiment; each names its ``Options`` here (``Source.options``), one
layer down, so that what the experiment derives from them needs no data
code: the fields a mixture's part may set (``part_fields``) and the paths
a workdir's config.json stores absolute (``path_fields``,
``experiment.paths``). ``FORMER`` maps the flat names of earlier versions
(``train_files``, ``hf_path``...) to the nested ones; they are still read,
from a command line, a config file or a workdir's config.json. A new
kind adds its record to ``KINDS`` and names it from its class;
``tests/data/test_source_options.py`` keeps the two lists one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType


@dataclasses.dataclass(frozen=True)
class FilesOptions:
  """Your files, ``config.data.files`` (read when data.name='files').

  Attributes:
    train / eval: comma-separated globs (local or gs://) of .txt, .jsonl,
      .parquet or .tsv files (.gz/.zst); without eval, the documents
      whose hash is below eval_fraction are held out (data/files.py).
    eval_fraction: the share held out without eval (None: 1%,
      ``data.files.DEFAULT_EVAL_FRACTION``).
  """
  train: str | None = None
  eval: str | None = None
  eval_fraction: float | None = None


@dataclasses.dataclass(frozen=True)
class HfOptions:
  """A Hugging Face dataset, ``config.data.hf`` (data/hf_datasets.py).

  Attributes:
    path: a folder written by ``save_to_disk`` (data.name='huggingface').
    config: the config of a dataset of the Hub
      (data.name='huggingface:OWNER/NAME').
  """
  path: str | None = None
  config: str | None = None


# The flat names of earlier versions, and the nested field each now is.
FORMER = {'train_files': 'files.train', 'eval_files': 'files.eval',
          'eval_fraction': 'files.eval_fraction', 'hf_path': 'hf.path',
          'hf_config': 'hf.config'}

# How a path field is made absolute (``experiment.paths``):
FOLDER = 'folder'  # always, against the current directory: it is made
EXISTING = 'existing'  # where it exists (else, e.g. a model id, as it is)
GLOBS = 'globs'  # comma-separated globs, each local one


@dataclasses.dataclass(frozen=True)
class Options:
  """The fields of ``config.data`` that one kind of source reads as its own.

  Attributes:
    kind: the kind's key in ``sources.KINDS``.
    fields: its own fields of config.data (a mixture's part may set them).
    paths: those naming a local path or a URL, dotted under its fields
      ('files.train'), each with how it is made absolute (FOLDER,
      EXISTING or GLOBS).
  """
  kind: str
  fields: tuple[str, ...] = ()
  paths: Mapping[str, str] = dataclasses.field(
      default_factory=lambda: MappingProxyType({}))

  def __post_init__(self):
    stray = sorted(p for p in self.paths
                   if p.split('.')[0] not in self.fields)
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
FILES = Options('files', _SPEC + ('files',),
                {'files.train': GLOBS, 'files.eval': GLOBS})
HUGGINGFACE = Options('huggingface', _SPEC + ('hf',), {'hf.path': EXISTING})
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
  (but the mixture's), its weight and its label; and the FORMER names."""
  own = [f for o in KINDS if o is not MIXTURE for f in o.fields]
  return tuple(dict.fromkeys(('name',) + PART + DATASET.fields + tuple(own)
                             + tuple(FORMER)))


def path_fields() -> dict[str, str]:
  """Every path field of ``config.data`` (the run's, the dataset's, each
  kind's; dotted where nested), with how it is made absolute."""
  out: dict[str, str] = {}
  for options in (RUN, DATASET) + KINDS:
    out.update(options.paths)
  return out
