"""Import parameters from a PyTorch, Hugging Face or safetensors file into a
new training workdir.

    python scripts/import_params.py --from gpt2_hf_dir \
        --config configs/gpt2_small.py:shakespeare --workdir runs/gpt2
    python scripts/import_params.py --from ende.pt \
        --config translate_ende --workdir runs/ende_imported
    python scripts/import_params.py --from lm.safetensors \
        --config lm_shakespeare --workdir runs/lm_copy \
        --config.optim.learning_rate=1e-4

--from is one of: a Hugging Face folder of GPT-2, Llama (2 and 3),
Mistral or Qwen2 (config.json, model.safetensors or its shards with
model.safetensors.index.json, tokenizer.json), or such a model's id in
the Hugging Face cache (read offline); a file from
scripts/export.py --format safetensors; a PyTorch state_dict of the
reference encoder-decoder or of GPT2LMHeadModel (from --format torch, or
your own torch.save(model.state_dict(), PATH)).

From a Hugging Face folder every model field comes from its config.json,
whatever model the config names (a --config.model.* flag with another
value is refused); the config gives data and optimizer, and the tensors
are streamed onto this host's devices. For the other files the experiment
config (and any --config.a.b=value override, as in train.py) gives the
architecture, data and optimizer; the file must fit it: fields it records
that differ, or shapes that do not fit, are named.
model.vocab_size unset is taken from the file. The tokenizer comes from the
Hugging Face directory's tokenizer.json (a Hugging Face tokenizer kind that
keeps the file's ids), else from PATH's stem + .tokenizer/ as export writes
it, else from the config's data, as train.py builds it.

The workdir gets what train.py writes: an Orbax checkpoint at the file's
step (0 when it has none) holding the parameters, a fresh optimizer state
and an unread data position, config.json and tokenizer/. Then
scripts/generate.py decodes with it, and train.py with the same config and
flags (printed at the end) fine-tunes it from that step.

Bad input (a missing --from path or config, a non-empty --workdir, a file
that does not fit the config) is one sentence on stderr and exit code 2,
before anything is written. The workdir is written under a temporary name
beside it and renamed at the end (in gs://, written in place and removed
on failure): a refusal or failure leaves it as it was, and the same
command, fixed, runs again.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from jax_transformer import cli
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment, doors
from jax_transformer.workdirs import importer

PROG = 'import_params.py'


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = cli.ArgumentParser(
      prog=PROG,
      description='Import a PyTorch, Hugging Face or safetensors file into '
                  'a new training workdir.',
      epilog='Any --config.a.b=value overrides a config field, as in '
             'train.py.')
  p.add_argument('--from', dest='source', required=True,
                 help='Hugging Face folder (GPT-2, Llama, Mistral, Qwen2) or '
                      'cached model id, safetensors file or PyTorch '
                      'state_dict')
  p.add_argument('--config', required=True,
                 help='experiment config, NAME[:preset] or configs/NAME.py[:preset]')
  p.add_argument('--workdir', required=True,
                 help='new (or empty) directory to write')
  args, overrides = p.parse_known_args(argv)
  args.overrides = overrides
  return args


def load_config(spec: str, overrides: Sequence[str]) -> Experiment:
  """The experiment of NAME[:preset] (or a file) with --config.*
  overrides, parsed as train.py parses them."""
  config, _, rest = cli.parse_config_flags(
      [PROG, '--config', spec, *overrides])
  if rest:
    raise UsageError(f'Unexpected arguments {rest}; overrides look like '
                     '--config.a.b=value.')
  return doors.from_command_line(config)


@cli.entry_point(PROG)
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  cfg = load_config(args.config, args.overrides)
  explicit = {a[len('--config.'):].split('=', 1)[0]
              for a in args.overrides if a.startswith('--config.')}
  done = importer.import_into(args.source, cfg, args.workdir, explicit)
  mc = done.model_config
  print(f'Imported {args.source} into {args.workdir} at step {done.step} '
        f'({cfg.model_kind}, d_model {mc.d_model}, '
        f'{mc.num_encoder_layers}+{mc.num_decoder_layers} layers, vocabulary '
        f'{mc.vocab_size}).')
  for note in done.notes:
    print(note)
  flags = ' '.join([*args.overrides, *done.extra_flags])
  print(f'Fine-tune with: python train.py --config {args.config} --workdir '
        f'{args.workdir} {flags}'.rstrip())
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
