"""The progress bar on process 0: finished steps, the last loss and
tokens/s, and a line per evaluation."""

from __future__ import annotations

from tqdm import tqdm


class ProgressBar:
  """A tqdm bar as a training hook (see hooks.py); counts steps as they
  finish, not as they are dispatched."""

  def __init__(self, initial: int, total: int, enabled: bool):
    self._enabled = enabled
    self._bar = tqdm(total=total, initial=initial, disable=not enabled,
                     dynamic_ncols=True, desc='train')

  def finished(self, run, step: int, metrics) -> None:
    del run, step, metrics
    self._bar.update(1)

  def logged(self, run, row: dict) -> None:
    if self._enabled and 'eval_loss' in row:
      bleu = f', BLEU {row["eval_bleu"]:.2f}' if 'eval_bleu' in row else ''
      self._bar.write(f'step {run.step}: train loss {row["loss"]:.4f}, eval '
                      f'loss {row["eval_loss"]:.4f}, perplexity '
                      f'{row["eval_perplexity"]:.2f}{bleu}')
    self._bar.set_postfix(loss=f'{row["loss"]:.3f}',
                          tok_s=f'{row["tokens_per_s"]:,.0f}')

  def end(self, run) -> None:
    del run
    self._bar.close()
