"""scripts/plot_metrics.py over metrics written as the trainer writes them."""

import struct

import pytest
import script_helpers

from jax_transformer.train import metrics
from jax_transformer.train.metrics import MetricWriter

PNG = b'\x89PNG\r\n\x1a\n'


def load_script():
  return script_helpers.load_script('plot_metrics')


def fake_run(workdir, steps, bleu=False, tokens=True, loss=4.0):
  """Rows as trainer.py logs them: train metrics every step, eval every 2."""
  writer = MetricWriter(str(workdir))
  for step in steps:
    row = {'loss': loss / step + 0.1, 'nll': loss / step,
           'tokens_per_s': 1000.0}
    if tokens:
      row['target_tokens'] = 512.0
    if step % 2 == 0:
      row['eval_loss'] = loss / step + 0.2
      if bleu:
        row['eval_bleu'] = 3.0 * step
    writer.write(step, row)
  writer.close()
  return str(workdir)


def png_size(path):
  """(width, height) from the PNG header."""
  with open(path, 'rb') as f:
    head = f.read(24)
  assert head[:8] == PNG
  return struct.unpack('>II', head[16:24])


def test_read_history_counts_resumed_steps_once(tmp_path):
  # Saved at step 2, ran to 3, resumed from 2: steps 3 logged twice.
  fake_run(tmp_path, [1, 2, 3])
  fake_run(tmp_path, [3, 4], loss=8.0)
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 5, "lo')  # killed mid-write
  rows = metrics.read_history(str(tmp_path))
  assert [r['step'] for r in rows] == [1, 2, 3, 4]
  assert rows[2]['nll'] == 8.0 / 3


def test_two_runs_make_one_png_against_steps_and_tokens(tmp_path, capsys):
  a = fake_run(tmp_path / 'base', [1, 2, 3], bleu=True)
  fake_run(tmp_path / 'base', [3, 4, 5, 6], bleu=True)  # resumed
  b = fake_run(tmp_path / 'big', range(1, 9))
  out = tmp_path / 'curves.png'
  assert load_script().main([a, b, '--out', str(out)]) == 0
  assert capsys.readouterr().err == ''
  # Two rows (steps, tokens) of two panels (loss, BLEU) at 100 dpi.
  assert png_size(out) == (1400, 800)
  assert out.stat().st_size > 10_000


def test_runs_without_tokens_or_bleu_get_one_panel(tmp_path, capsys):
  old = fake_run(tmp_path / 'old', [1, 2, 3, 4], tokens=False)
  out = tmp_path / 'old.png'
  assert load_script().main([old, '--out', str(out)]) == 0
  assert 'old logs no target_tokens' in capsys.readouterr().err
  assert png_size(out) == (800, 400)


def test_run_names_are_basenames_unless_they_clash():
  names = load_script().run_names(['runs/a', 'runs/b/', 'x/b'])
  assert names == ['a', 'runs/b/', 'x/b']


@pytest.mark.parametrize('setup,fragment', [
    ('missing', 'is not a directory'),
    ('no metrics', 'has no metrics.jsonl'),
    ('empty', 'holds no rows yet'),
])
def test_a_workdir_without_metrics_exits_2(tmp_path, capsys, setup,
                                           fragment):
  good = fake_run(tmp_path / 'good', [1, 2])
  bad = tmp_path / 'bad'
  if setup != 'missing':
    bad.mkdir()
  if setup == 'empty':
    (bad / 'metrics.jsonl').write_text('')
  out = tmp_path / 'x.png'
  code = load_script().main([good, str(bad), '--out', str(out)])
  err = capsys.readouterr().err
  assert code == 2 and fragment in err and str(bad) in err
  assert err.count('\n') == 1
  assert not out.exists()


def test_an_unwritable_out_exits_2(tmp_path, capsys):
  good = fake_run(tmp_path / 'good', [1, 2])
  for out, fragment in ((tmp_path / 'no' / 'x.png', 'does not exist'),
                        (tmp_path / 'x.nope', 'not supported')):
    assert load_script().main([good, '--out', str(out)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count('\n') == 1, err


def test_time_is_summed_over_starts_and_drawn(tmp_path, capsys):
  work = tmp_path / 'timed'
  for start, steps in enumerate(([1, 2], [2, 3, 4])):
    fake_run(work, steps)
    writer = MetricWriter(str(work))  # each start's last row, again
    writer.write(steps[-1], {
        'loss': 1.0, 'nll': 1.0, 'target_tokens': 512.0,
        'total_startup_s': 10.0, 'total_compile_s': 5.0,
        'total_step_s': 80.0 - 40 * start, 'total_other_s': 5.0,
        'wall_s': 100.0 - 40 * start, 'goodput': 0.8})
    writer.close()
  out = tmp_path / 'timed.png'
  assert load_script().main([str(work), '--out', str(out)]) == 0
  printed = capsys.readouterr().out
  # 120 s of steps in 160 s; the second start's 15 s of start-up lost.
  assert printed.startswith('timed, 2 start(s): Time: 160.0 s wall, '
                            'goodput 75.0% (start-up 10.0 s, compile 5.0 s,')
  assert 'restarts 15.0 s' in printed
  assert png_size(out) == (800, 1000)  # a third row: the time bar
