"""Train steps lowered (``lowering.lower_train``) and compiled ahead of
time from abstract state on the 8-device mesh (what
scripts/compile_at_size.py does at 350M and 1.3B)."""


import pytest

from jax_transformer.cli import load_config
from jax_transformer.compile import lowering, prove
from jax_transformer.experiment import Experiment
from jax_transformer.train import memory


def proved(cfg) -> prove.Proof:
  return prove.prove(lowering.lower_here(Experiment.of(cfg), vocab_size=256))


def small(layers, scan, remat='dots'):
  cfg = load_config('lm_350m')
  cfg.model.update(d_model=64, num_heads=4, d_ff=128, max_len=64,
                   num_decoder_layers=layers, scan_layers=scan, remat=remat)
  cfg.update(seq_len=64, batch_size=8, loss_chunk_size=128)
  cfg.mesh.update(data=1, fsdp=4, tensor=2)
  return cfg


@pytest.mark.slow
def test_compiles_at_fsdp_x_tensor_without_running():
  proof = proved(small(4, True))
  assert proof.num_params > 0 and proof.compile_s > 0
  assert proof.xla is not None and proof.xla.total > 0
  # Matrices split 8 ways (norm scales and biases replicated; the layer
  # axis never split).
  full = proof.num_params * 4
  assert full / 8 <= proof.estimate.parameters < full / 4
  assert memory.readable(proof.estimate.total)


@pytest.mark.slow
def test_scanned_step_does_not_grow_with_depth():
  """The compiled program's size, a proxy for compile time that no host
  noise changes: the same at 2 and 8 layers scanned; unrolled, 4 layers
  already ~1.8x 2 (8350 -> 15196 instructions; 8 unrolled layers would
  only cost the suite a longer compile)."""
  scanned = [proved(small(n, True)).instructions for n in (2, 8)]
  unrolled = [proved(small(n, False, 'none')).instructions
              for n in (2, 4)]
  assert scanned[1] == pytest.approx(scanned[0], rel=0.05)
  assert unrolled[1] > 1.6 * unrolled[0]


@pytest.mark.slow
def test_remat_lowers_xla_memory_at_size():
  none, full = (proved(small(4, True, r)).xla.temporaries
                for r in ('none', 'full'))
  assert full < none


def test_an_instruction_run_is_lowered_with_its_loss_mask(tmp_path):
  """A fine-tuning run on prompt/completion data trains on the completion
  only: the step compiled for it takes the batch's loss_mask."""
  import jax

  from jax_transformer.compile import lowering
  from jax_transformer.model import sharding
  cfg = small(2, True)
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:8])
  assert 'loss_mask' not in lowering.abstract_batch(Experiment.of(cfg), mesh)
  data = tmp_path / 'chat.jsonl'
  data.write_text('{"prompt": "Hi", "completion": " there"}\n')
  cfg.data.update(name='files', direction='prompt-completion',
                  train_files=str(data))
  batch = lowering.abstract_batch(Experiment.of(cfg), mesh)
  assert batch['loss_mask'].shape == (8, 64)
  run = lowering.lower_train(Experiment.of(cfg), jax.devices()[:8], 'cpu',
                             vocab_size=256)
  assert 'loss_mask' in run.batch
