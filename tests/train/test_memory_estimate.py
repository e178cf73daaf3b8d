"""Memory before compute: device memories, the per-device footprint against
real arrays and XLA's figure, and runs that do not fit refused in one
sentence without touching a saved checkpoint."""

import hashlib
import os

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.cli import load_config
from jax_transformer.experiment import Experiment
from jax_transformer.model import sharding
from jax_transformer.train import (
  checkpoint,
  memory,
  model_setup,
  steps,
  trainer,
)

VOCAB = 64


def lm_cfg(**mesh):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.model.update(d_model=32, num_heads=4, num_kv_heads=2, d_ff=64)
  cfg.mesh.update(mesh)
  return cfg


def planned(cfg, devices=None):
  """(setup, mesh, abstract state, shardings) as the trainer plans them."""
  setup = model_setup.build(Experiment.of(cfg), VOCAB)
  mesh = sharding.make_mesh(cfg.mesh, devices)
  abstract = setup.abstract_state(cfg.seed)
  shardings, _ = steps.state_shardings(setup, mesh, abstract)
  return setup, mesh, abstract, shardings


@pytest.mark.parametrize('kind, gb', [
    ('NVIDIA H100 80GB HBM3', 80), ('NVIDIA H100 PCIe', 80),
    ('NVIDIA H100 NVL', 94), ('NVIDIA H200', 141),
    ('NVIDIA A100-SXM4-40GB', 40), ('NVIDIA A100-SXM4-80GB', 80),
    ('NVIDIA A100 80GB PCIe', 80), ('TPU v4', 32 * 2**30 / 1e9),
    ('TPU v5 lite', 16 * 2**30 / 1e9), ('TPU v5', 95 * 2**30 / 1e9),
    ('TPU v6 lite', 32 * 2**30 / 1e9),
])
def test_builtin_memory_by_device_kind(kind, gb):
  assert memory.builtin_memory(kind) == int(gb * 1e9)


@pytest.mark.parametrize('kind', ['cpu', 'NVIDIA GeForce RTX 4090'])
def test_unknown_device_kinds_have_no_builtin_memory(kind):
  assert memory.builtin_memory(kind) is None
  budget = memory.Budget.of(lm_cfg().device_memory_gb, kind)
  assert budget.bytes is None
  budget.check(10**15, 'Anything')  # unknown memory: report, never refuse


def test_config_field_overrides_the_builtin_memory():
  cfg = lm_cfg()
  kind = 'NVIDIA H100 80GB HBM3'
  builtin = memory.Budget.of(cfg.device_memory_gb, kind)
  assert builtin.bytes == 80 * 10**9
  assert builtin.source == f'each {kind} has 80.0 GB'
  cfg.device_memory_gb = 12.5
  budget = memory.Budget.of(cfg.device_memory_gb, kind)
  assert budget.bytes == 12_500_000_000
  assert budget.source == 'config.device_memory_gb is 12.5'


def shard_bytes(tree) -> int:
  """Bytes of every array of tree on the first device (real arrays)."""
  device = jax.devices()[0]
  return sum(s.data.nbytes for leaf in jax.tree.leaves(tree)
             for s in leaf.addressable_shards if s.device == device)


def estimate(cfg, setup, abstract, shardings, mesh) -> memory.Footprint:
  exp = Experiment.of(cfg)
  return memory.estimate(exp.step_shape, exp.loss_chunk_size,
                         setup.model_config, abstract, shardings, mesh)


@pytest.mark.parametrize('mesh, count', [
    (dict(data=1, fsdp=1, tensor=1), 1),
    (dict(data=2, fsdp=2, tensor=2), 8),
])
def test_state_bytes_equal_the_real_arrays(mesh, count):
  cfg = lm_cfg(**mesh)
  setup, mesh, abstract, shardings = planned(cfg, jax.devices()[:count])
  state = jax.jit(lambda: setup.init_state(cfg.seed),
                  out_shardings=shardings)()
  params, rest = memory.state_bytes(abstract, shardings)
  assert params == shard_bytes(state['params'])
  assert rest == shard_bytes({k: v for k, v in state.items()
                              if k != 'params'})
  footprint = estimate(cfg, setup, abstract, shardings, mesh)
  assert footprint.parameters == footprint.gradients == params
  assert footprint.optimizer_state == rest


def lm_batch(b, t):
  return {k: (b, t) for k in ('inputs', 'targets', 'segment_ids',
                              'positions')}


def translation_batch(b, s, t):
  return {**{k: (b, s) for k in ('src', 'src_segment_ids', 'src_positions')},
          **{k: (b, t) for k in ('tgt_in', 'tgt_out', 'tgt_segment_ids',
                                 'tgt_positions')}}


def small_lm():
  cfg = lm_cfg(data=1)
  cfg.model.update(d_model=64, num_heads=4, num_kv_heads=None, d_ff=256,
                   num_decoder_layers=2, max_len=64)
  cfg.seq_len = 64
  return cfg, lm_batch(cfg.batch_size, cfg.seq_len)


def small_translation():
  cfg = load_config('translate_ende:tiny')
  cfg.mesh.update(data=1)
  b, t = cfg.batch_size, cfg.seq_len
  return cfg, translation_batch(b, cfg.data.src_len or t, t)


def compiled_step(cfg, batch_shapes):
  """(footprint, the train step compiled as the trainer compiles it) on
  one device."""
  setup, mesh, abstract, shardings = planned(cfg, jax.devices()[:1])
  batch_sharding = sharding.batch_sharding(mesh)
  step = jax.jit(
      steps.make_train_step(setup.model_def, setup.tx),
      in_shardings=(shardings, batch_sharding),
      out_shardings=(shardings, NamedSharding(mesh, PartitionSpec())),
      donate_argnums=0)
  state = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      abstract, shardings)
  batch = {k: jax.ShapeDtypeStruct(v, np.int32, sharding=batch_sharding)
           for k, v in batch_shapes.items()}
  return (estimate(cfg, setup, abstract, shardings, mesh),
          step.lower(state, batch).compile())


@pytest.fixture(scope='module')
def lm_step():
  return compiled_step(*small_lm())


@pytest.mark.parametrize('make', [small_lm, small_translation])
def test_activation_estimate_tracks_xla(make, lm_step):
  """XLA's temporaries hold the activations and the gradients (and the
  optimizer's scratch). Observed on XLA:CPU (jax 0.10.2), remat 'none':
  (activations + gradients) / temporaries = 0.61 for the decoder LM, 0.76
  for the encoder-decoder. The estimate errs low by design (XLA:CPU also
  keeps attention scores and GELU's pieces), so the bounds are 0.4x-1x."""
  footprint, compiled = (lm_step if make is small_lm
                         else compiled_step(*make()))
  figure = memory.Compiled.of(compiled)
  ratio = (footprint.activations + footprint.gradients) / figure.temporaries
  assert 0.4 < ratio < 1.0, ratio
  assert 0.4 < footprint.total / figure.total < 1.0


def test_xla_figure_refuses_a_step_that_does_not_fit(lm_step):
  footprint, compiled = lm_step
  figure = memory.Compiled.of(compiled)
  assert figure.total == (figure.arguments + figure.outputs
                          + figure.temporaries - figure.aliased)
  # The state is donated: its buffers are counted once.
  assert figure.aliased >= footprint.parameters + footprint.optimizer_state
  fits = memory.Budget(figure.total, 'config.device_memory_gb is X')
  assert 'XLA\'s figure' in memory.after_compile(compiled, fits, footprint)
  short = memory.Budget(figure.total - 1, 'config.device_memory_gb is X')
  with pytest.raises(ValueError) as err:
    memory.after_compile(compiled, short, footprint)
  message = str(err.value)
  assert message.startswith('The compiled train step needs ')
  assert memory.readable(figure.temporaries) in message
  assert 'but config.device_memory_gb is X; lower batch_size' in message
  assert '\n' not in message


class NoAnalysis:
  def memory_analysis(self):
    return None


def test_no_xla_figure_is_reported_not_refused():
  footprint = memory.Footprint(1, 1, 1, 1)
  line = memory.after_compile(NoAnalysis(), memory.Budget(0, 'tiny'),
                              footprint)
  assert 'no figure' in line


def activations(remat='none', **fields):
  cfg = lm_cfg()
  cfg.model.update(num_decoder_layers=6, remat=remat, **fields)
  mc = Experiment.of(cfg).model_config(VOCAB)
  return memory.activation_bytes(mc, batch=8, tgt_len=64)


def test_remat_lowers_the_activation_estimate():
  assert activations('full') < activations('dots') < activations('none')


def test_activation_estimate_counts_what_the_backward_keeps():
  # Attention probabilities: 4 + 1 + 4 bytes per [B, N, T, T] element
  # through the explicit (dropout) path, 4 through XLA's.
  explicit = activations(attention_dropout_rate=0.1)
  assert explicit - activations() == 6 * 5 * 8 * 4 * 64 * 64
  # threefry dropout keeps one-byte masks: two D-wide and one F-wide per
  # layer, and the embedding's.
  masks = activations(dropout_rng='threefry') - activations()
  assert masks == (6 * (2 * 32 + 64) + 32) * 8 * 64


def test_chunked_loss_counts_one_chunk_of_logits():
  cfg = lm_cfg()
  mc = Experiment.of(cfg).model_config(VOCAB)
  whole = memory.activation_bytes(mc, 8, 64)
  chunked = memory.activation_bytes(mc, 8, 64, loss_rows=16)
  assert whole - chunked == 2 * 4 * mc.vocab_size * (8 * 64 - 16)


class FakePrepared:
  class tokenizer:  # noqa: N801
    vocab_size = VOCAB


def forbidden_jit(*args, **kwargs):
  raise AssertionError('compiled a run that does not fit')


def refusal(cfg, workdir, monkeypatch) -> str:
  """The one-sentence refusal of train_and_evaluate, which must come before
  anything compiles."""
  with monkeypatch.context() as patch, pytest.raises(ValueError) as err:
    patch.setattr(jax, 'jit', forbidden_jit)
    trainer.train_and_evaluate(cfg, str(workdir))
  assert '\n' not in str(err.value)
  return str(err.value)


def test_a_run_that_does_not_fit_is_refused_before_compiling(tmp_path,
                                                             monkeypatch):
  cfg = lm_cfg(data=-1)
  cfg.device_memory_gb = 1e-6
  monkeypatch.setattr(trainer, 'prepare_data', lambda cfg: FakePrepared())
  message = refusal(cfg, tmp_path, monkeypatch)
  assert message.startswith('The run needs about ')
  for part in ('parameters', 'optimizer state', 'gradients',
               'activations (estimated)'):
    assert f'{part} ' in message
  assert message.endswith('but config.device_memory_gb is 1e-06; lower '
                          'batch_size, turn on model.remat or add devices.')
  # Not even config.json; the (empty) checkpoints folder made up front is
  # removed with the refusal (trainer.remove_failed_start).
  assert os.listdir(tmp_path) == []


def snapshot(path) -> dict[str, str]:
  """Every file under path by its content hash."""
  out = {}
  for root, _, files in os.walk(path):
    for name in files:
      with open(os.path.join(root, name), 'rb') as f:
        out[os.path.relpath(os.path.join(root, name), path)] = (
            hashlib.sha256(f.read()).hexdigest())
  return out


@pytest.mark.slow
def test_refusals_leave_the_saved_checkpoint_alone(tmp_path, monkeypatch,
                                                   real_data_dir):
  """A resumed run that does not fit is refused before compiling (by the
  estimate) or after compiling (by XLA's figure), before its first step:
  the checkpoint it would resume stays as it was."""
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = real_data_dir
  cfg.sample.enabled = False
  cfg.num_steps = 3
  work = tmp_path / 'w'
  trainer.train_and_evaluate(cfg, str(work))
  saved = snapshot(work / 'checkpoints')
  cfg.num_steps, cfg.device_memory_gb = 6, 1e-6
  assert refusal(cfg, work, monkeypatch).startswith('The run needs about')
  assert snapshot(work / 'checkpoints') == saved
  # An estimate that fits: XLA's figure refuses the compiled step.
  monkeypatch.setattr(memory, 'estimate',
                      lambda *a: memory.Footprint(0, 0, 0, 0))
  with pytest.raises(ValueError, match='^The compiled train step needs'):
    trainer.train_and_evaluate(cfg, str(work))
  assert snapshot(work / 'checkpoints') == saved
  checkpointer = checkpoint.Checkpointer(str(work))
  assert checkpointer.latest_step() == 3
  checkpointer.close()


def test_fsdp_counts_one_layer_and_the_embedding_gathered():
  cfg = lm_cfg()
  mc = Experiment.of(cfg).model_config(VOCAB)
  devices = jax.devices()[:4]
  plain = sharding.make_mesh({'data': 4}, devices)
  fsdp = sharding.make_mesh({'data': 1, 'fsdp': 4}, devices)
  split = sharding.make_mesh({'data': 1, 'fsdp': 2, 'tensor': 2}, devices)
  assert memory.gathered_bytes(mc, plain) == 0
  d, f, v = mc.d_model, mc.d_ff, mc.vocab_size
  kv = 2 * mc.kv_heads * mc.head_dim  # grouped keys and values
  layer = d * (2 * d + kv) + 2 * d * f  # q, out, k, v; two MLP matrices
  assert memory.gathered_bytes(mc, fsdp) == 4 * (layer + 2 * v * d)
  assert memory.gathered_bytes(mc, split) == 4 * (layer + 2 * v * d) // 2


def test_the_estimate_counts_no_probabilities_where_a_kernel_runs():
  from jax_transformer.model import attention
  mc = Experiment.of(lm_cfg()).model_config(VOCAB)
  with attention.compiling_for('tpu'):  # the splash kernel
    fused = memory.activation_bytes(mc, batch=8, tgt_len=64)
  probabilities = 4 * mc.num_heads * 64 * 64 * 8 * mc.num_decoder_layers
  assert memory.activation_bytes(mc, 8, 64) - fused == probabilities
