"""Tiny stand-ins for the real corpora, for tests and quick experiments.

``write_fake_plays`` and ``write_fake_ding`` write files in the formats the
``shakespeare`` and ``ding_en_de`` builders read, small enough to build in a
fraction of a second; point the builders at them with ``source_dir`` /
``source_path``. The text is generated here, not taken from the corpora.
"""

from __future__ import annotations

import os

from jax_transformer.data import shakespeare

_SPEAKERS = ('FIRST WITCH', 'KING', 'QUEEN', 'FOOL', 'GHOST')
_WORDS = ('night', 'crown', 'storm', 'sword', 'moon', 'grave', 'letter',
          'heart', 'blood', 'sea', 'dream', 'ring')


def fake_play(play: str, num_paragraphs: int = 30) -> str:
  """A play-shaped text: heading, then speeches separated by blank lines."""
  paras = [f'THE FAKE TRAGEDY OF {play.upper()}', 'ACT I.']
  for i in range(num_paragraphs - 2):
    speaker = _SPEAKERS[i % len(_SPEAKERS)]
    lines = [f'{speaker}.']
    for j in range(1 + i % 3):
      w = _WORDS[(i * 7 + j) % len(_WORDS)]
      # Trailing spaces check that the builder strips them.
      lines.append(f'The {w} of {play} is line {i}.{j}  ')
    paras.append('\n'.join(lines))
  return '\n\n\n'.join(paras) + '\n'


def write_fake_plays(directory: str | os.PathLike,
                     plays=shakespeare.DEFAULT_PLAYS,
                     num_paragraphs: int = 30) -> str:
  """Writes ``<play>_gut.txt`` for each play; returns the directory."""
  os.makedirs(directory, exist_ok=True)
  for play in plays:
    with open(shakespeare.play_path(str(directory), play), 'w',
              encoding='utf-8') as f:
      f.write(fake_play(play, num_paragraphs))
  return str(directory)


_DE_EN_NOUNS = (('Hund', 'dog'), ('Katze', 'cat'), ('Vogel', 'bird'),
                ('Fisch', 'fish'), ('Baum', 'tree'), ('Zug', 'train'))
_DE_EN_VERBS = (('läuft', 'runs'), ('schläft', 'sleeps'), ('wartet', 'waits'),
                ('singt', 'sings'))


def fake_sentence_pairs(n: int) -> list[tuple[str, str]]:
  """n distinct (en, de) sentence pairs of varying length."""
  pairs = []
  for i in range(n):
    de_n, en_n = _DE_EN_NOUNS[i % len(_DE_EN_NOUNS)]
    de_v, en_v = _DE_EN_VERBS[(i // len(_DE_EN_NOUNS)) % len(_DE_EN_VERBS)]
    extra = ' sehr' * (i % 5)
    extra_en = ' very' * (i % 5)
    pairs.append((f'The {en_n} number {i} {en_v}{extra_en} well.',
                  f'Der {de_n} Nummer {i} {de_v}{extra} gut.'))
  return pairs


# Lines of every kind the parser must handle; the kept pairs are listed in
# FAKE_DING_EXPECTED (en, de).
FAKE_DING_HEADER = """\
# Version :: fake
# License :: none, generated for tests
Hund {m} | Hunde {pl} :: dog | dogs
Abschied {m} | Abschied nehmen | Er verabschiedete sich. :: leave | to take leave | He took leave.
Abend {m} | Guten Abend! :: evening | Good evening!
Ich gebe sie in deine Obhut.; Ich gebe sie deiner Obhut anheim. :: I commend them to your care.
Er wollte sich auf keine Diskussion (darüber) einlassen. :: He didn’t want to get into a debate (about it).
Könnten Sie bitte lauter/langsamer sprechen? :: Could you please speak louder/slower?
Wie schreibt man …? :: How does one write …?
Er kommt morgen wieder. | Sie kommt heute. :: He is coming back tomorrow.
Das Wetter ist heute schön. [ugs.] :: The weather is nice today [Br.].
"""
FAKE_DING_EXPECTED = (
    ('He took leave.', 'Er verabschiedete sich.'),
    ('I commend them to your care.', 'Ich gebe sie in deine Obhut.'),
    ('I commend them to your care.', 'Ich gebe sie deiner Obhut anheim.'),
    ("He didn't want to get into a debate.",
     'Er wollte sich auf keine Diskussion einlassen.'),
    ('The weather is nice today.', 'Das Wetter ist heute schön.'),
)


def write_fake_ding(path: str | os.PathLike, num_generated: int = 200) -> str:
  """A Ding-format file: FAKE_DING_HEADER plus generated sentence lines."""
  os.makedirs(os.path.dirname(str(path)) or '.', exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(FAKE_DING_HEADER)
    for en, de in fake_sentence_pairs(num_generated):
      f.write(f'Satz {{m}} | {de} :: sentence | {en}\n')
  return str(path)


def fake_ding_pairs(num_generated: int = 200) -> list[tuple[str, str]]:
  """Every (en, de) pair the builder must extract from write_fake_ding."""
  return list(FAKE_DING_EXPECTED) + fake_sentence_pairs(num_generated)
