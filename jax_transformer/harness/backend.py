"""lm-evaluation-harness's model API over this project's decoder LMs.

``JaxTransformerLM`` is registered with lm-eval as ``jax_transformer``::

  import lm_eval
  from jax_transformer.harness import JaxTransformerLM
  lm = JaxTransformerLM.from_workdir('runs/lm_shakespeare')
  lm_eval.simple_evaluate(model=lm, tasks=['hellaswag'])

  # or by name: model='jax_transformer',
  #             model_args='workdir=runs/lm_shakespeare,step=600'

The workdir is anything ``restore.load_model`` opens: a training workdir
(local or ``gs://``, sharded over this host's devices as training placed
it), one made by ``import_params.py``, a LoRA run, or a Hugging Face
folder read directly.

Tokens are lm-eval's: its ``TemplateLM`` splits each context and
continuation (the whole encoded, then cut at the context's length), an
empty context is the prefix token alone, inputs longer than the model are
cut from the left, and ``loglikelihood_rolling`` scores lm-eval's own
rolling windows. The BOS convention is the checkpoint's: a Hugging Face
tokenizer adds what its ``tokenizer.json`` adds (as lm-eval's Hugging Face
backend does: BOS for Llama, nothing for GPT-2); the project's own
tokenizers add BOS unless the model was trained on a token stream, and
their rolling windows start with one BOS.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import jax
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import (
  get_rolling_token_windows,
  make_disjoint_window,
  simple_parse_args_string,
)
from tqdm import tqdm

from jax_transformer import fields
from jax_transformer.data.batching import markers
from jax_transformer.decoding.sampling import Sampler, greedy
from jax_transformer.errors import UsageError
from jax_transformer.harness import generation, scoring
from jax_transformer.harness.scoring import Request
from jax_transformer.workdirs import restore

DEFAULT_BATCH_SIZE = 16
ENCODER_DECODER = (
    'lm-eval tasks score decoder-only language models; this workdir holds '
    'an encoder-decoder (a translation model): score it with '
    'scripts/evaluate.py without --tasks (BLEU and chrF with beam search).')
DEFAULT_MAX_GEN_TOKS = 256


def _positive_int(name: str, value: Any) -> int:
  try:
    number = int(value)
  except (TypeError, ValueError):
    number = 0
  if number < 1 or str(number) != str(value).strip():
    raise fields.not_an_integer(name, value)
  return number


@register_model('jax_transformer')
class JaxTransformerLM(TemplateLM):
  """A trained decoder LM, as lm-eval's ``LM``.

  trained: ``restore.Trained`` (the model with its parameters, tokenizer,
    config, step and mesh); batch_size: rows per batch (rounded up to a
    multiple of the mesh's batch shards); max_gen_toks: the default most
    new tokens of ``generate_until``; seed: the sampling key's;
    heartbeat: called after every batch (a trainer's stall watch hears
    that the run is alive).
  """

  def __init__(self, trained: restore.Trained,
               batch_size: int = DEFAULT_BATCH_SIZE,
               max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, seed: int = 0,
               heartbeat: Callable[[], None] | None = None):
    super().__init__()
    if trained.family.has_source:
      raise UsageError(ENCODER_DECODER)
    self.trained = trained
    self.model = trained.model
    self.mesh = trained.mesh
    self.hf = trained.tokenizer.kind == 'huggingface'
    self.stream = not self.hf and trained.stream
    self._bos, self._eos = markers(trained.tokenizer)
    self._batch_size = _positive_int('batch_size', batch_size)
    self._max_gen_toks = _positive_int('max_gen_toks', max_gen_toks)
    self.seed = seed
    self._heartbeat = heartbeat or (lambda: None)
    self.scorer = scoring.Scorer(self.model, self._batch_size, self.mesh)

  @classmethod
  def from_workdir(cls, workdir: str, step: int | None = None,
                   **kwargs) -> JaxTransformerLM:
    """The checkpoint at ``step`` (default: the latest) of ``workdir``."""
    return cls(restore.load_model(workdir, step), **kwargs)

  @classmethod
  def create_from_arg_string(cls, arg_string: str,
                             additional_config: dict | None = None
                             ) -> JaxTransformerLM:
    """``workdir=W[,step=N][,batch_size=B][,max_gen_toks=M]``, as lm-eval's
    ``--model_args`` gives them."""
    args = simple_parse_args_string(arg_string)
    extra = additional_config or {}
    if extra.get('batch_size') not in (None, 'auto'):
      args.setdefault('batch_size', extra['batch_size'])
    if 'workdir' not in args:
      raise UsageError('model_args needs workdir=..., the training workdir '
                       'or Hugging Face folder to score.')
    step = args.pop('step', None)
    return cls.from_workdir(str(args.pop('workdir')),
                            None if step is None else int(step), **args)

  # ------------------------------------------------------------------
  # Tokens.

  @property
  def eot_token_id(self) -> int:
    return self._eos

  @property
  def prefix_token_id(self) -> int:
    if self.hf:
      bos = self.trained.tokenizer.bos_id
      return self._eos if bos is None else bos
    return self._eos if self.stream else self._bos

  @property
  def max_length(self) -> int:
    return self.model.config.max_len

  @property
  def max_gen_toks(self) -> int:
    return self._max_gen_toks

  @property
  def batch_size(self) -> int:
    return self._batch_size

  @property
  def tokenizer_name(self) -> str:
    return type(self.trained.tokenizer).__name__

  def _adds_special_tokens(self, string: str) -> bool:
    """lm-eval's default: what the tokenizer adds, except to a text that
    starts with the prefix token's own text."""
    token = self.trained.tokenizer.id_to_token(self.prefix_token_id) \
        if self.hf else None
    return not (token and string.startswith(token))

  def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                 **kwargs) -> list[int]:
    tokenizer = self.trained.tokenizer
    if add_special_tokens is None:
      add_special_tokens = self._adds_special_tokens(string)
    if self.hf:
      return tokenizer.encode(string, add_special_tokens=add_special_tokens)
    ids = list(tokenizer.encode(string))
    return ([self._bos, *ids] if add_special_tokens and not self.stream
            else ids)

  def tok_decode(self, tokens) -> str:
    return self.trained.tokenizer.decode(tokens)

  def _progress(self, bar) -> Callable[[int], None]:
    def done(n: int) -> None:
      bar.update(n)
      self._heartbeat()
    return done

  # ------------------------------------------------------------------
  # Log-likelihoods.

  def _request(self, context: list[int], continuation: list[int]
               ) -> Request:
    """lm-eval's left truncation: the last max_len + 1 tokens, the last
    one only predicted."""
    if len(continuation) > self.max_length:
      raise UsageError(
          f'A continuation of {len(continuation)} tokens does not fit the '
          f"model's context of {self.max_length} tokens; lower the task's "
          'length or score it with a longer-context model.')
    whole = (context + continuation)[-(self.max_length + 1):]
    return Request(tuple(whole[:-1]), tuple(continuation))

  def _score(self, requests: list[Request], disable_tqdm: bool, what: str
             ) -> list[tuple[float, bool]]:
    with tqdm(total=len(requests), disable=disable_tqdm, file=sys.stderr,
              desc=what) as bar:
      return self.scorer.score(requests, self._progress(bar))

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False,
                            **kwargs) -> list[tuple[float, bool]]:
    rows = [self._request(list(context), list(continuation))
            for _, context, continuation in requests]
    answers = self._score(rows, disable_tqdm, 'loglikelihood')
    for (key, _, _), answer in zip(requests, answers):
      if key is not None:
        self.cache_hook.add_partial('loglikelihood', key, answer)
    return answers

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False
                            ) -> list[float]:
    windows, owners = [], []
    for i, (string,) in enumerate(r.args for r in requests):
      # lm-eval's Hugging Face backend encodes the text as a context (with
      # a Llama tokenizer's BOS) and prefixes the prefix token as well; the
      # project's own tokenizers get one BOS, as in training.
      tokens = (self.tok_encode(string) if self.hf
                else self.tok_encode(string, add_special_tokens=False))
      for window in map(make_disjoint_window, get_rolling_token_windows(
          token_list=tokens, prefix_token=self.prefix_token_id,
          max_seq_len=self.max_length, context_len=1)):
        windows.append(self._request(*map(list, window)))
        owners.append(i)
    answers = self._score(windows, disable_tqdm, 'loglikelihood_rolling')
    totals = [0.0] * len(requests)
    for i, (logprob, _) in zip(owners, answers):
      totals[i] += logprob
    for request, total in zip(requests, totals):
      self.cache_hook.add_partial('loglikelihood_rolling', request.args,
                                  total)
    return totals

  # ------------------------------------------------------------------
  # Generation.

  def _sampler(self, kwargs: dict):
    if not kwargs.get('do_sample') or not kwargs.get('temperature'):
      return greedy
    return Sampler(float(kwargs['temperature']), kwargs.get('top_k'),
                   kwargs.get('top_p'))

  def generate_until(self, requests, disable_tqdm: bool = False
                     ) -> list[str]:
    groups: dict[str, list[int]] = {}
    for i, request in enumerate(requests):
      groups.setdefault(repr(sorted(request.args[1].items())), []).append(i)
    outputs = [''] * len(requests)
    with tqdm(total=len(requests), disable=disable_tqdm, file=sys.stderr,
              desc='generate_until') as bar:
      for members in groups.values():
        kwargs = normalize_gen_kwargs(dict(requests[members[0]].args[1]),
                                      self.max_gen_toks)
        stops = handle_stop_sequences(kwargs.pop('until', None), eos=None)
        new_tokens = int(kwargs.pop('max_gen_toks'))
        room = self.max_length - new_tokens
        if room < 1:
          raise UsageError(
              f"A task asks for {new_tokens} new tokens, which leaves no room "
              f"for its context in the model's {self.max_length}; lower "
              'max_gen_toks in its generation_kwargs.')
        rows = [self.tok_encode(requests[i].args[0])[-room:]
                for i in members]
        texts = generation.generate_until(
            self.model, rows, self.tok_decode, stops, new_tokens,
            sampler=self._sampler(kwargs),
            key=jax.random.key(self.seed), eos_id=self._eos,
            batch_size=self.batch_size, mesh=self.mesh,
            progress=self._progress(bar))
        for i, text in zip(members, texts):
          outputs[i] = text
          self.cache_hook.add_partial('generate_until', requests[i].args,
                                      text)
    return outputs
