"""The checks of an experiment that need more than its fields: its data
(``check_fields``), the devices (``check_experiment``) and the workdir it
would resume (``check_resumable``). Each field's own checks live with its
part of the experiment (``Experiment.check``)."""

from __future__ import annotations

import json

import jax

from jax_transformer import data
from jax_transformer.data import corpus
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.experiment.paths import absolute_paths
from jax_transformer.model import sharding
from jax_transformer.runtime import devices, storage
from jax_transformer.runtime.workdir import WorkdirPaths, resolve


def check_fields(exp: Experiment) -> Experiment:
  """exp typed, after its fields' checks and its data's: the dataset it
  names (a 'files' glob that matches nothing, a task misspelt), its
  mixture, its tokenizer_path; all before any data is prepared."""
  exp = Experiment.of(exp)
  exp.check()
  if exp.data.data_dir and storage.is_remote(exp.data.data_dir):
    # TFDS's array_record reader opens local files only.
    raise UsageError(f'config.data.data_dir={exp.data.data_dir}: prepared '
                     'data must be on a local or mounted path (object '
                     'storage works for --workdir).')
  data.check_config(exp.data)
  return exp


def check_experiment(exp: Experiment) -> jax.sharding.Mesh:
  """The mesh, after refusing in one sentence a model or a mesh that
  cannot work, before any data is prepared (the vocabulary is not known
  yet: a stand-in size checks everything else)."""
  exp = Experiment.of(exp)
  exp.model_config(1)
  devices.check_accelerators(exp.mesh.sizes)
  mesh = sharding.make_mesh(exp.mesh.sizes)
  for size in (exp.batch_size, exp.eval_batch_size):
    sharding.check_batch(size, mesh)
  return mesh


def check_resumable(exp: Experiment, workdir: str | WorkdirPaths
                    ) -> Experiment:
  """Refuses to resume a workdir trained with another model or data (paths
  compared absolute: an old config.json's relative ones from the current
  directory), or on files that changed since it started unless
  config.data.accept_changed_corpus says to go on (then one line says the
  data iterator starts afresh). Returns exp with accept_changed_corpus
  True only where that applies, which ``data.train_iterator`` reads."""
  exp = Experiment.of(exp)
  paths = resolve(workdir)
  if not paths.config.exists():
    return _fresh_stream(exp)
  saved = Experiment.of(json.loads(paths.config.read_text()))
  changed = absolute_paths(exp).changed_since(absolute_paths(saved))
  if changed:
    raise UsageError(f'{workdir} holds a run with a different config.'
                     f'{changed}; use a new --workdir or the same config to '
                     'resume.')
  old = corpus.read(paths.root)
  what = (corpus.change(old, corpus.record(exp.data))
          if old and 'files' in old else None)
  if what is None:
    return _fresh_stream(exp)
  if not exp.data.accept_changed_corpus:
    raise UsageError(f'The corpus of {workdir} changed since this run '
                     f'started: {what}; pass '
                     '--config.data.accept_changed_corpus=true to go on with '
                     'the new corpus, which restarts the data iterator.')
  if jax.process_index() == 0:
    print(f'The corpus changed since this run started: {what}; going on '
          'with it (config.data.accept_changed_corpus): the data iterator '
          'starts afresh.', flush=True)
  return exp


def _fresh_stream(exp: Experiment) -> Experiment:
  """exp with accept_changed_corpus off: nothing changed to accept."""
  return exp.replace(data=exp.data.replace(accept_changed_corpus=False))
