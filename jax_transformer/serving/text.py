"""An answer's text as its tokens arrive: handed out in pieces, cut at a
stop string.

Tokens do not map to text one by one (a byte-level token may hold half of
a character; SentencePiece drops or adds spaces at word starts), so the
answer is decoded whole after each token and the new part handed out. Two
kinds of text are held back until the next token settles them: a trailing
U+FFFD (an unfinished UTF-8 sequence), and a tail that may be the start of
a stop string (so no piece of a stop string is ever streamed).
"""

from __future__ import annotations

from typing import Any, Sequence


class AnswerText:
  """tokenizer: ``decode(ids) -> str``; stops: strings that end the answer
  (the answer ends before the first; not included)."""

  def __init__(self, tokenizer: Any, stops: Sequence[str] = ()):
    self._tokenizer = tokenizer
    self._stops = [s for s in stops if s]
    self._ids: list[int] = []
    self._sent = 0           # characters handed out so far
    self.stopped = False     # a stop string was found

  @property
  def tokens(self) -> int:
    return len(self._ids)

  def _cut(self, text: str) -> str:
    """text up to its first stop string (from where it may start)."""
    first = min((i for i in (text.find(s) for s in self._stops) if i >= 0),
                default=-1)
    if first >= 0:
      self.stopped = True
      return text[:first]
    return text

  def _held(self, text: str) -> int:
    """How many trailing characters may still change or start a stop."""
    if text.endswith('\ufffd'):
      return len(text) - len(text.rstrip('\ufffd'))
    longest = 0
    for stop in self._stops:
      for n in range(min(len(stop) - 1, len(text)), longest, -1):
        if text.endswith(stop[:n]):
          longest = n
          break
    return longest

  def add(self, token: int) -> str:
    """The text that token settles ('' if none yet)."""
    self._ids.append(int(token))
    text = self._cut(self._tokenizer.decode(self._ids))
    end = len(text) if self.stopped else len(text) - self._held(text)
    piece = text[self._sent:end] if end > self._sent else ''
    self._sent = max(self._sent, end)
    return piece

  def finish(self) -> str:
    """What was held back, once no token follows."""
    text = self._cut(self._tokenizer.decode(self._ids))
    piece = text[self._sent:]
    self._sent = len(text)
    return piece
