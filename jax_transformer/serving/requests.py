"""The bodies of OpenAI's completion and chat completion requests, checked.

Fields the API defines and this server does not implement are accepted at
their defaults only (``n`` 1, no ``logprobs``, no penalties): any other
value, and any field the API does not define, is refused with a message
that names it. ``ignore_eos`` is an extension (as other servers have it):
the answer runs to ``max_tokens`` whatever the model says, which a
benchmark needs.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

# OpenAI's own bound on stop sequences.
MOST_STOPS = 4


class StreamOptions(BaseModel):
  model_config = ConfigDict(extra='forbid')
  include_usage: bool = False


class Sampling(BaseModel):
  """What both endpoints share."""
  model_config = ConfigDict(extra='forbid')

  model: str
  max_tokens: int | None = Field(default=None, ge=1)
  temperature: float = Field(default=1.0, ge=0.0, le=2.0)
  top_p: float = Field(default=1.0, gt=0.0, le=1.0)
  seed: int | None = None
  stop: str | list[str] | None = None
  stream: bool = False
  stream_options: StreamOptions | None = None
  user: str | None = None
  ignore_eos: bool = False
  # Defined by the API, taken at their defaults only.
  n: Literal[1] = 1
  presence_penalty: Literal[0] = 0
  frequency_penalty: Literal[0] = 0
  logit_bias: dict[str, float] | None = None
  logprobs: Any = None

  @pydantic.field_validator('stop')
  @classmethod
  def _few_stops(cls, stop):
    stops = [stop] if isinstance(stop, str) else stop or []
    if len(stops) > MOST_STOPS:
      raise ValueError(f'at most {MOST_STOPS} stop sequences, got '
                       f'{len(stops)}')
    return stop

  @pydantic.field_validator('logit_bias')
  @classmethod
  def _no_bias(cls, bias):
    if bias:
      raise ValueError('logit_bias is not supported')
    return bias

  @pydantic.field_validator('logprobs')
  @classmethod
  def _no_logprobs(cls, value):
    if value not in (None, False, 0):
      raise ValueError('logprobs are not supported')
    return value

  @property
  def stops(self) -> list[str]:
    return [self.stop] if isinstance(self.stop, str) else self.stop or []

  @property
  def include_usage(self) -> bool:
    return bool(self.stream_options and self.stream_options.include_usage)


class Completion(Sampling):
  """POST /v1/completions: a prompt (text, several texts, token ids or
  several lists of them) continued."""
  prompt: str | list[str] | list[int] | list[list[int]]
  echo: Literal[False] = False
  best_of: Literal[1] | None = None
  suffix: None = None

  @pydantic.field_validator('prompt')
  @classmethod
  def _some_prompt(cls, prompt):
    if isinstance(prompt, list) and not prompt:
      raise ValueError('give at least one prompt')
    return prompt

  @property
  def prompts(self) -> list[str | list[int]]:
    """Each prompt: a text, or token ids."""
    if isinstance(self.prompt, str):
      return [self.prompt]
    if all(isinstance(p, int) for p in self.prompt):
      return [list(self.prompt)]
    return list(self.prompt)


class TextPart(BaseModel):
  model_config = ConfigDict(extra='forbid')
  type: Literal['text']
  text: str


class Message(BaseModel):
  model_config = ConfigDict(extra='forbid')
  role: Literal['system', 'developer', 'user', 'assistant', 'tool']
  content: str | list[TextPart]
  name: str | None = None

  @property
  def text(self) -> str:
    if isinstance(self.content, str):
      return self.content
    return ''.join(part.text for part in self.content)


class ChatCompletion(Sampling):
  """POST /v1/chat/completions: a conversation answered by the
  assistant."""
  messages: list[Message] = Field(min_length=1)
  max_completion_tokens: int | None = Field(default=None, ge=1)

  @property
  def conversation(self) -> list[dict[str, str]]:
    # 'developer' is the newer name of 'system'.
    return [{'role': 'system' if m.role == 'developer' else m.role,
             'content': m.text} for m in self.messages]

  @property
  def most_tokens(self) -> int | None:
    return self.max_completion_tokens or self.max_tokens
