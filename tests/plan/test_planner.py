"""The planner's parts on CPU host devices: candidates, pruning, and a
small plan with its cache (the step-time model's own tests are
tests/compile/test_step_model.py)."""

import flop_count
import jax
import pytest

from jax_transformer import cli
from jax_transformer.compile import step_model
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment, doors
from jax_transformer.plan import candidates as cands
from jax_transformer.plan import search


def tiny_lm() -> Experiment:
  return doors.load('lm_shakespeare:tiny').replace(
      **{'model.num_heads': 4, 'model.num_decoder_layers': 2})


def test_every_candidate_makes_the_global_batch_from_whole_shards():
  cfg = tiny_lm()
  found = cands.enumerate_candidates(cfg, 8, 32)
  meshes = {(c.data, c.fsdp, c.tensor) for c in found}
  # tensor divides the 4 heads: 1, 2 or 4; data x fsdp the rest.
  assert meshes == {(d, 8 // t // d, t) for t in (1, 2, 4)
                    for d in (1, 2, 4, 8) if d <= 8 // t}
  assert {c.remat for c in found} == set(cands.REMATS)
  for c in found:
    assert c.batch_size * c.grad_accum_steps == 32
    assert c.batch_size % (c.data * c.fsdp) == 0


def test_param_dtypes_can_be_held_to_float32():
  found = cands.enumerate_candidates(tiny_lm(), 8, 32,
                                     param_dtypes=('float32',))
  assert found and {c.param_dtype for c in found} == {'float32'}


def test_remat_policies_can_be_held_to_some():
  found = cands.enumerate_candidates(tiny_lm(), 8, 32, remats=('none',))
  assert found and {c.remat for c in found} == {'none'}


def test_slices_keep_only_data_parallelism_between_them():
  found = cands.enumerate_candidates(tiny_lm(), 8, 32, slices=2)
  assert found and all(c.data % 2 == 0 for c in found)


def test_a_candidate_as_flags_gives_back_its_config():
  c = cands.Candidate(2, 2, 2, 'full', 'bfloat16', 8192, 16, 2)
  cfg, _, _ = cli.parse_config_flags(
      ['train.py', '--config', 'lm_shakespeare:tiny', *c.flags()])
  assert {a: cfg.mesh[a] for a in ('data', 'fsdp', 'tensor')} == {
      'data': 2, 'fsdp': 2, 'tensor': 2}
  assert (cfg.model.remat, cfg.model.param_dtype, cfg.loss_chunk_size,
          cfg.batch_size, cfg.optim.grad_accum_steps) == (
              'full', 'bfloat16', 8192, 16, 2)
  base = doors.load('lm_shakespeare:tiny')
  assert c.apply(base) == doors.from_command_line(cfg)


def test_the_shipped_layout_resolves_the_free_mesh_axis():
  own = cands.shipped(doors.load('lm_1_3b'), 64, 1024)
  assert (own.data, own.fsdp, own.tensor) == (1, 64, 1)
  assert (own.remat, own.loss_chunk_size, own.batch_size,
          own.grad_accum_steps) == ('dots', 262144, 1024, 1)


def test_a_plan_compiles_the_shipped_layout_ranks_and_caches(tmp_path):
  cfg = tiny_lm().replace(**{'mesh.data': -1, 'mesh.fsdp': 1,
                             'mesh.tensor': 1})
  rates = step_model.Rates('host', 1e11, 1e10, 1e9, 10 ** 9, overlap=False)
  where = search.Where('here', tuple(jax.devices()), 'cpu', rates)
  layouts = [cands.Candidate(2, 1, 4, 'full', 'float32', 0, 16, 1)]
  rows = search.plan(cfg, 'tiny', where, 16, cache_dir=str(tmp_path),
                     vocab_size=64, only=layouts, log=lambda _: None)
  update_flops = flop_count.lm_train_flops(cfg.model_config(64), 16,
                                           cfg.seq_len)
  assert len(rows) == 2 and sum(r['shipped'] for r in rows) == 1
  own = next(r for r in rows if r['shipped'])
  assert (own['data'], own['fsdp'], own['tensor']) == (8, 1, 1)
  for r in rows:
    assert r['status'] == 'compiled' and r['fits']
    assert r['per_chip_bytes'] > 0 and r['compile_s'] > 0
    # Host devices run the parts in turn: an update is its steps' parts
    # added. The MFU is the model's FLOPs of an update (counted from its
    # weights' shapes) at the rates' peak on 8 chips over that time.
    assert r['batch_size'] * r['grad_accum_steps'] == 16
    parts = r['compute_s'] + r['hbm_s'] + r['link_s']
    assert r['hbm_s'] > 0 and r['link_s'] > 0
    assert r['predicted_step_s'] == pytest.approx(
        r['grad_accum_steps'] * parts, rel=1e-12)
    assert r['predicted_mfu'] == pytest.approx(
        update_flops / (8 * 1e11 * r['predicted_step_s']), rel=1e-9)
  assert [r['rank'] for r in rows] == [1, 2]
  times = [r['predicted_step_s'] for r in rows]
  assert all(a <= b * 1.005 for a, b in zip(times, times[1:]))  # ties: 0.5%
  again = search.plan(cfg, 'tiny', where, 16, cache_dir=str(tmp_path),
                      vocab_size=64, only=layouts, log=lambda _: None)
  assert {r['status'] for r in again} == {'cached'}
  assert [r['predicted_step_s'] for r in again] == [
      r['predicted_step_s'] for r in rows]


def test_a_batch_no_layout_can_split_is_one_sentence():
  rates = step_model.Rates('host', 1e11, 1e10, 1e9, None, overlap=False)
  where = search.Where('here', tuple(jax.devices()), 'cpu', rates)
  with pytest.raises(UsageError, match='cannot be split over 8 chips'):
    search.plan(tiny_lm(), 'tiny', where, 3, cache_dir=None,
                vocab_size=64,
                log=lambda _: None)


def test_a_setup_with_another_accumulation_has_the_same_state_shapes():
  from jax_transformer.train import model_setup
  cfg = tiny_lm()
  accumulating = cfg.replace(**{'optim.grad_accum_steps': 4})
  built = model_setup.build(accumulating, 64)
  derived = model_setup.with_optimizer(model_setup.build(cfg, 64),
                                      accumulating)
  want = built.abstract_state(0)
  got = model_setup.abstract_state_of(derived, 0)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  assert jax.tree.leaves(jax.tree.map(lambda a, b: (a.shape, a.dtype) == (
      b.shape, b.dtype), got, want)) == [True] * len(jax.tree.leaves(want))
  assert len(jax.tree.leaves(want)) > len(jax.tree.leaves(
      model_setup.build(cfg, 64).abstract_state(0)))  # the accumulator


def test_compiles_recalibrate_the_estimate_and_prune_what_cannot_fit(
    monkeypatch):
  """A compiler that needs 3x the estimate: after the first compile, the
  other candidates of its remat policy are pruned unseen."""
  def compile_at_three_times(s, where, cache, vocab_size):
    return {'per_chip_bytes': 3 * s.estimate_bytes, 'compile_s': 1.0,
            'status': 'compiled', 'fingerprint': s.candidate.describe()}
  monkeypatch.setattr(search, 'compile_candidate', compile_at_three_times)
  cfg = tiny_lm().replace(**{'mesh.data': -1, 'mesh.fsdp': 1,
                             'mesh.tensor': 1})
  layouts = [cands.Candidate(d, 8 // d, 1, 'none', 'float32', 0, 16, 1)
             for d in (1, 2, 4)]
  sizer = search.Sizer(cfg, search.Where(
      'here', tuple(jax.devices()), 'cpu',
      step_model.Rates('x', 1e11, 1e10, 1e9, None)), 64)
  smallest = min(sizer(c).estimate_bytes
                 for c in layouts + [cands.shipped(cfg, 8, 16)])
  rates = step_model.Rates('x', 1e11, 1e10, 1e9, 2 * smallest)
  where = search.Where('here', tuple(jax.devices()), 'cpu', rates)
  rows = search.plan(cfg, 'tiny', where, 16, cache_dir=None,
                     vocab_size=64,
                     only=layouts, log=lambda _: None)
  shipped = next(r for r in rows if r['shipped'])
  assert shipped['status'] == 'compiled' and not shipped['fits']
  others = [r for r in rows if not r['shipped']]
  assert {r['status'] for r in others} == {'pruned'}
  assert all('estimate x 3.00' in r['reason'] for r in others)


def test_the_guess_counts_the_heads_reads_of_each_loss_chunk():
  """A chunk of a few rows a chip still reads the whole head: the guess
  puts 1024 rows a shard before 8192 rows on 256 chips."""
  from jax_transformer.plan import candidates as cands
  from jax_transformer.plan import search
  from jax_transformer.train import model_setup
  cfg = doors.load('lm_350m')
  mc = model_setup.build(cfg, 32768).model_config
  small, per_shard = (cands.Candidate(1, 256, 1, 'dots', 'float32', chunk,
                                      1024, 1) for chunk in (8192, 262144))
  head = mc.d_model * mc.vocab_size
  assert search.loss_chunk_hbm(small, cfg, mc) == 128 * head * 14
  assert search.loss_chunk_hbm(per_shard, cfg, mc) == 4 * head * 14
  where = search.Where('v5e-256', tuple(range(256)), 'tpu',
                       search.step_model.Rates.of_target(
                           search.targets.target('v5e-256')))
  n = 350_000_000
  assert (search.guess(per_shard, cfg, mc, n, where)
          < search.guess(small, cfg, mc, n, where))
