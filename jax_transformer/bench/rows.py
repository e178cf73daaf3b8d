"""Result rows of the benchmark scripts, streamed as JSON lines."""

from __future__ import annotations

import json
from typing import Iterable


def stream(rows: Iterable[dict], output: str | None = None) -> list[dict]:
  """Prints each row to stdout as one JSON line as soon as it exists (a
  long run shows progress, and a killed one keeps what it measured), also
  writes it to the file ``output`` when given; returns all rows."""
  kept = []
  out = open(output, 'w') if output else None
  try:
    for row in rows:
      kept.append(row)
      line = json.dumps(row)
      print(line, flush=True)
      if out:
        out.write(line + '\n')
        out.flush()
  finally:
    if out:
      out.close()
  return kept
