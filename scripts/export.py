"""Export a trained checkpoint for PyTorch, Hugging Face or any framework.

    python scripts/export.py --workdir runs/ende --format torch \
        --out ende.pt --verify
    python scripts/export.py --workdir runs/gpt2 --format hf --out gpt2_hf \
        --verify
    python scripts/export.py --workdir runs/lm --format safetensors \
        --out lm.safetensors --step 400

Formats:

  torch        OUT: a state_dict (torch.save) for the reference
               encoder-decoder (jax_transformer/interop/torch_reference.py) or for
               transformers' GPT2LMHeadModel (a GPT-2-shaped decoder LM:
               learned positions, pre-norm LayerNorm, biases, MHA, no
               SwiGLU); OUT's stem + .json: the config; + .tokenizer/: the
               tokenizer. Rebuild and load it in PyTorch:

                 import json, torch
                 meta = json.load(open('ende.json'))
                 from jax_transformer.interop.torch_reference import TorchTransformer
                 model = TorchTransformer(**meta['torch_config'])
                 # a GPT-2-shaped LM instead:
                 # from transformers import GPT2Config, GPT2LMHeadModel
                 # model = GPT2LMHeadModel(GPT2Config(**meta['torch_config']))
                 model.load_state_dict(torch.load('ende.pt', weights_only=True),
                                       strict=True)

  hf           OUT/: config.json + model.safetensors for
               transformers.GPT2LMHeadModel.from_pretrained(OUT), with
               tokenizer.json for AutoTokenizer when the tokenizer has a
               transformers form (bytes and imported Hugging Face tokenizers;
               not SentencePiece). Decoder-only GPT-2-shaped models only.
  safetensors  OUT: every parameter under its dotted name (as
               jax_transformer.model.params.split names it), the model kind,
               config and step in the file's metadata; OUT's stem +
               .tokenizer/: the tokenizer.

A LoRA run (config.lora.rank > 0) is exported merged: every format holds
W + (alpha / r) A B in each adapted kernel, a plain model. With --format hf
--lora_adapter_only, OUT/ holds the adapters alone, as PEFT writes them
(adapter_config.json + adapter_model.safetensors), for
peft.PeftModel.from_pretrained(base, OUT) on the init_from model.

--verify loads the export with PyTorch (transformers for GPT-2; for
safetensors, a JAX model rebuilt from the file alone) and compares its
logits with the JAX model on two batches of the workdir's validation data
(random in-vocab ids when the data is not available, saying so), printing
the largest absolute difference. scripts/import_params.py reads all three
formats back.

The workdir may be local or ``gs://``; the checkpoint is restored over
this machine's devices as training sharded it (``restore.inference_mesh``)
and gathered to the host one parameter at a time to be written.

Exit codes: 0 done; 1 --verify found a difference above --tolerance; 2 bad
input (missing workdir or checkpoint step, a format the model does not fit),
one sentence on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from jax_transformer import cli
from jax_transformer.errors import UsageError
from jax_transformer.runtime import storage
from jax_transformer.workdirs import exporter as export_lib
from jax_transformer.workdirs import restore

PROG = 'export.py'
VERIFY_FAILED = 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = cli.ArgumentParser(
      prog=PROG,
      description='Export a trained checkpoint as a PyTorch state_dict, a '
                  'Hugging Face GPT-2 directory or a safetensors file.')
  p.add_argument('--workdir', required=True,
                 help='training directory (config.json, tokenizer/, '
                      'checkpoints/)')
  p.add_argument('--format', required=True, choices=export_lib.FORMATS)
  p.add_argument('--out', required=True,
                 help='file to write (a directory for --format hf)')
  p.add_argument('--step', type=int, default=None,
                 help='checkpoint step (default: the latest)')
  p.add_argument('--lora_adapter_only', action='store_true',
                 help='a LoRA run, --format hf: write its adapters alone as '
                      'a PEFT folder (adapter_config.json + '
                      'adapter_model.safetensors), not the merged model')
  p.add_argument('--verify', action='store_true',
                 help='compare the export\'s logits with the JAX model\'s')
  p.add_argument('--tolerance', type=float, default=export_lib.TOLERANCE,
                 help='largest absolute logit difference --verify accepts')
  return p.parse_args(argv)


@cli.entry_point(PROG)
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  storage.check_reachable(args.workdir)  # a gs:// bucket answers, at once
  if args.lora_adapter_only:
    if args.format != 'hf' or args.verify:
      raise UsageError('--lora_adapter_only writes a PEFT folder: give '
                       '--format hf, without --verify.')
    step, notes = export_lib.write_lora_adapter(args.workdir, args.step,
                                                args.out)
    for note in notes:
      print(note)
    print(f'Wrote the LoRA adapters of step {step} of {args.workdir} to '
          f'{args.out} (PEFT).')
    return 0
  trained = restore.load_model(args.workdir, args.step)
  for note in export_lib.write(trained, args.format, args.out):
    print(note)
  print(f'Wrote {args.out} ({args.format}) from step {trained.step} of '
        f'{args.workdir}.')
  if args.verify:
    batches, inputs, note = export_lib.verification_batches(trained)
    if note:
      print(note)
    result = export_lib.verify(trained, args.format, args.out, batches,
                               inputs)
    print(result)
    try:
      export_lib.check_verified(result, args.tolerance)
    except export_lib.VerificationError as e:
      print(f'{PROG}: {e}', file=sys.stderr)
      return VERIFY_FAILED
  return 0


if __name__ == '__main__':
  sys.exit(cli.then_exit(main)())
