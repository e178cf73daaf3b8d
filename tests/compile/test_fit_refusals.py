"""Every way a target's compiler says a run does not fit is one sentence
and exit status 2: the train step's, the eval step's and the decode's
figures over the chip's memory, and the compiler's own RESOURCE_EXHAUSTED
(whose figure the decode once let through as a 62-line traceback).

Fast: the compiler's refusal is stood in for; the real ones run in
test_target_compile.py (slow).
"""

import jax
import pytest

from jax_transformer import cli
from jax_transformer.compile import report
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.model import sharding
from jax_transformer.train import model_setup, steps

OVER_HBM = ('RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory '
            'required for HLO temporaries (154.18G) exceeds available HBM '
            '(15.75G)\nand more lines')


class Refused:
  """A lowered step whose compile the compiler refuses."""

  def __init__(self, message):
    self.message = message

  def compile(self):
    raise jax.errors.JaxRuntimeError(self.message)


def test_the_compilers_refusal_is_a_figure_with_or_without_one():
  step = report.compile_lowered(Refused(OVER_HBM))
  assert step.compiled is None and not step.fits(16 * 2 ** 30)
  assert step.per_chip_bytes == int(154.18 * 2 ** 30)
  assert step.refused.startswith('RESOURCE_EXHAUSTED: Ran out of memory')
  bare = report.compile_lowered(Refused('RESOURCE_EXHAUSTED: out of memory'))
  assert bare.per_chip_bytes is None and not bare.fits(None)
  with pytest.raises(jax.errors.JaxRuntimeError, match='INTERNAL'):
    report.compile_lowered(Refused('INTERNAL: a compiler bug'))


def test_the_decode_turns_the_compilers_refusal_into_a_figure(monkeypatch):
  cfg = cli.load_config('lm_shakespeare:tiny')
  setup = model_setup.build(Experiment.of(cfg), 64)
  mesh = sharding.make_mesh(cfg.mesh)
  shardings, _ = steps.state_shardings(setup, mesh,
                                       setup.abstract_state(cfg.seed))
  monkeypatch.setattr(jax.stages.Lowered, 'compile',
                      lambda self: Refused(OVER_HBM).compile())
  decode = report.compile_decode(Experiment.of(cfg), setup, mesh, shardings['params'],
                                 'cpu')
  assert decode.compiled is None
  assert decode.per_chip_bytes == int(154.18 * 2 ** 30)


ROW = {'config': 'lm_7b', 'target': 'v5e-4', 'devices': 4,
       'device_kind': 'TPU v5 lite', 'mesh': {'data': 1, 'fsdp': 4,
                                               'tensor': 1},
       'chip_memory_bytes': 16 * 2 ** 30, 'per_chip_bytes': 10 * 2 ** 30,
       'fits': True, 'over_by_bytes': 0, 'eval_fits': True,
       'eval_per_chip_bytes': 2 ** 30, 'decode_fits': False,
       'decode_per_chip_bytes': int(154.18 * 2 ** 30),
       'refused': {'decode': 'RESOURCE_EXHAUSTED: Ran out of memory on HBM'},
       'compile_s': 1.0, 'predicted_mfu': None, 'attention_kernel': 'splash'}


@pytest.mark.parametrize('change, sentence', [
    ({}, '--aot_target v5e-4: lm_7b needs 165.5 GB per chip to decode by '
     'the TPU v5 lite compiler, and a chip has 17.2 GB; lower batch_size'),
    ({'decode_per_chip_bytes': None},
     '--aot_target v5e-4: lm_7b does not fit to decode by the TPU v5 lite '
     'compiler, which ran out of memory (RESOURCE_EXHAUSTED: Ran out of '
     'memory on HBM), and a chip has 17.2 GB;'),
    ({'fits': False, 'per_chip_bytes': 20 * 2 ** 30},
     '--aot_target v5e-4: lm_7b needs 21.5 GB per chip to train by the TPU '
     'v5 lite compiler'),
    ({'decode_fits': True, 'eval_fits': False,
      'eval_per_chip_bytes': 18 * 2 ** 30},
     '--aot_target v5e-4: lm_7b needs 19.3 GB per chip to evaluate'),
])
def test_each_step_over_memory_is_refused_naming_it(change, sentence):
  row = dict(ROW, **change)
  assert report.not_fitting(row, '--aot_target v5e-4').startswith(sentence)
  assert 'does not' in report.summary(row)
  assert report.not_fitting(dict(ROW, decode_fits=True),
                            '--aot_target v5e-4') is None


def test_check_fits_refuses_a_decode_over_memory_in_one_line(monkeypatch,
                                                            capsys):
  monkeypatch.setattr(report, 'report', lambda *args: dict(ROW))
  with pytest.raises(UsageError) as err:
    report.check_fits(None, 'lm_7b', 'v5e-4')
  # train.py's entry point: one line on stderr, exit status 2.
  assert cli.report('train.py', err.value) == cli.EXIT_USAGE
  lines = capsys.readouterr().err.strip().splitlines()
  assert lines == ['train.py: error: '
                   + report.not_fitting(ROW, '--aot_target v5e-4')]
