"""lm1b and WMT14 de-en prepared for real, without TensorFlow or network.

The builders' real code runs (TFDS's ``_generate_examples`` and parsers, our
extraction and globbing, ``download_and_prepare`` writing ArrayRecord, then
``tfds.data_source`` reading it with TFDS's own class) on small archives
written here with the layout of the real downloads. Only the network step is
replaced: ``DownloadManager.download`` returns those archives by URL, and
TFDS's ``extract``/``download_and_extract`` (which need TensorFlow) fail if
reached.
"""

import gzip
import importlib.util
import io
import os
import pathlib
import tarfile

import pytest
import tensorflow_datasets as tfds
import tree
from etils import epath

from jax_transformer import data
from jax_transformer.data import builders, datasets, downloads, lm1b, wmt
from jax_transformer.data import testing as data_testing
from jax_transformer.data.tokenizers import ByteTokenizer

NO_TF = importlib.util.find_spec('tensorflow') is None
LM1B_URL = ('http://www.statmt.org/lm-benchmark/'
            '1-billion-word-language-modeling-benchmark-r13output.tar.gz')
LM1B_TOP = '1-billion-word-language-modeling-benchmark-r13output'
EUROPARL_URL = 'http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz'
COMMONCRAWL_URL = ('http://www.statmt.org/wmt13/'
                   'training-parallel-commoncrawl.tgz')
DEV_URL = 'http://data.statmt.org/wmt19/translation-task/dev.tgz'
# The news-commentary release each builder trains on: URL, folder in the tgz.
NEWS_COMMENTARY = {
    'wmt14_translate/de-en': (
        'http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz',
        'training/news-commentary-v9'),
    'wmt_t2t_translate/de-en': (
        'http://data.statmt.org/wmt18/translation-task/'
        'training-parallel-nc-v13.tgz',
        'training-parallel-nc-v13/news-commentary-v13'),
}


# --------------------------------------------------------------- fake downloads


def write_tgz(path, files: dict[str, str]) -> str:
  """A gzipped tar holding files (archive path -> UTF-8 text)."""
  src = f'{path}.src'
  for name, text in files.items():
    os.makedirs(os.path.dirname(os.path.join(src, name)), exist_ok=True)
    with open(os.path.join(src, name), 'w', encoding='utf-8') as f:
      f.write(text)
  with tarfile.open(path, 'w:gz') as tar:
    for name in files:
      tar.add(os.path.join(src, name), arcname=name)
  return str(path)


@pytest.fixture
def fake_downloads(monkeypatch):
  """Serves {url: archive path} set by the test; TFDS's extractor fails."""
  served = {}

  def download(self, url_or_urls):
    del self
    return tree.map_structure(lambda url: epath.Path(served[url]),
                              url_or_urls)

  def tfds_extractor(*args, **kwargs):
    raise AssertionError('reached TFDS extraction, which needs TensorFlow')

  monkeypatch.setattr(tfds.download.DownloadManager, 'download', download)
  for name in ('extract', 'download_and_extract', 'iter_archive'):
    monkeypatch.setattr(tfds.download.DownloadManager, name, tfds_extractor)
  # The hosts served here answer (offline, the real ones do not: that
  # refusal is tests/data/test_rough_edges.py's).
  monkeypatch.setattr(downloads, 'check_reachable', lambda *a, **k: None)
  return served


def tf_free_manager(tmp_path) -> downloads.DownloadManager:
  return downloads.DownloadManager(
      tfds.download.DownloadManager(download_dir=tmp_path / 'dl'))


def lines(texts) -> str:
  return ''.join(f'{t}\n' for t in texts)


def texts(name, split, data_dir, key='text'):
  source = datasets.load_source(name, split, data_dir)
  return [datasets.as_text(source[i][key]) for i in range(len(source))]


# ----------------------------------------------------------------- extraction


def test_extraction_keeps_tfds_layout_and_skips_what_tfds_skips(tmp_path):
  archive = tmp_path / 'corpus.tar.gz'
  with tarfile.open(archive, 'w:gz') as tar:
    for name, text in [('top/a.txt', 'a'), ('top/sub/b.txt', 'b'),
                       ('top/._a.txt', 'mac fork'), ('top/c.txt~', 'backup'),
                       ('../outside.txt', 'escape'), ('/abs.txt', 'abs')]:
      info = tarfile.TarInfo(name)
      info.size = len(text)
      tar.addfile(info, io.BytesIO(text.encode()))
  manager = tf_free_manager(tmp_path)
  out = pathlib.Path(manager.extract(str(archive)))
  # TFDS's own folder name, so either extraction is reused by the other.
  assert out == tmp_path / 'dl' / 'extracted' / 'TAR_GZ.corpus.tar.gz'
  found = sorted(str(p.relative_to(out)) for p in out.rglob('*')
                 if p.is_file())
  assert found == ['top/a.txt', 'top/sub/b.txt']
  assert (out / 'top' / 'sub' / 'b.txt').read_text() == 'b'
  assert not (tmp_path / 'outside.txt').exists()
  assert [p.name for p in out.parent.iterdir()] == [out.name]  # no tmp left
  members = {n: f.read() for n, f in manager.iter_archive(str(archive))}
  assert members == {'top/a.txt': b'a', 'top/sub/b.txt': b'b'}
  (out / 'top' / 'a.txt').write_text('kept')
  assert manager.extract({'x': [str(archive)]}) == {'x': [out]}
  assert (out / 'top' / 'a.txt').read_text() == 'kept'  # reused, not redone


def test_extraction_of_a_gzipped_file(tmp_path):
  archive = tmp_path / 'giga-fren.release2.fixed.en.gz'
  with gzip.open(archive, 'wt', encoding='utf-8') as f:
    f.write('Größe\n')
  manager = tf_free_manager(tmp_path)
  out = manager.extract(str(archive))
  assert out.name == 'GZIP.giga-fren.release2.fixed.en.gz'
  assert out.read_text(encoding='utf-8') == 'Größe\n'


@pytest.mark.skipif(not NO_TF, reason='TFDS extracts fine with TensorFlow')
def test_tfds_own_extractor_needs_tensorflow(tmp_path):
  # Why the builders here exist: if this fails, TFDS extracts without TF.
  archive = write_tgz(tmp_path / 'x.tgz', {'a/b.txt': 'b'})
  with pytest.raises(Exception, match='tensorflow'):
    tfds.download.DownloadManager(download_dir=tmp_path / 'dl').extract(
        archive)


@pytest.mark.skipif(not NO_TF, reason='TFDS copies such URLs with TensorFlow')
def test_source_only_tensorflow_fetches_fails_before_any_download(
    tmp_path, fake_downloads):
  assert not fake_downloads  # a download would fail with KeyError instead
  manager = tf_free_manager(tmp_path)
  with pytest.raises(RuntimeError, match='package tensorflow is not'):
    manager.download_and_extract({'a': 'http://a/x.tgz',
                                  'b': 'ftp://nlp.example/c.zip'})


# ----------------------------------------------------------------------- lm1b


def lm1b_lines(shard: int, n: int = 3) -> list[str]:
  """Tokenised sentences as in lm1b, with some non-ASCII text."""
  return [f'Die Katze {shard} schläft , sagte er {i} .' if i % 2 else
          f'The market rose {shard}.{i} % on Tuesday .' for i in range(n)]


def write_fake_lm1b(directory) -> tuple[str, list[str], list[str]]:
  """The r13output tarball's layout; returns (archive, train, test lines)."""
  train_dir = f'{LM1B_TOP}/training-monolingual.tokenized.shuffled'
  heldout_dir = f'{LM1B_TOP}/heldout-monolingual.tokenized.shuffled'
  files = {f'{LM1B_TOP}/README': 'not a split\n'}
  train, test = [], []
  for shard in (1, 2, 99):
    files[f'{train_dir}/news.en-{shard:05d}-of-00100'] = lines(
        # Trailing spaces: TFDS strips each line.
        s + '  ' for s in lm1b_lines(shard))
    train += lm1b_lines(shard)
  for shard in (0, 49):
    files[f'{heldout_dir}/news.en.heldout-{shard:05d}-of-00050'] = lines(
        lm1b_lines(100 + shard, 2))
    test += lm1b_lines(100 + shard, 2)
  # Not news.en.heldout-*: no split may read it.
  files[f'{heldout_dir}/news.en-00000-of-00100'] = lines(['never read .'])
  archive = os.path.join(directory, f'{LM1B_TOP}.tar.gz')
  return write_tgz(archive, files), train, test


def test_lm1b_prepared_from_fake_archive(tmp_path, fake_downloads):
  archive, train, test = write_fake_lm1b(tmp_path)
  fake_downloads[LM1B_URL] = archive
  data_dir = str(tmp_path / 'tfds')
  prepared = data.prepare('lm1b', data_dir, tokenizer='byte')
  assert prepared.num_examples == {'train': 9, 'test': 4}
  assert os.path.isdir(os.path.join(data_dir, 'lm1b', '1.1.0'))
  # Read back by TFDS's own lm1b class: the files are TFDS's dataset.
  assert tfds.builder_cls('lm1b') is not lm1b.Lm1b
  assert sorted(texts('lm1b', 'train', data_dir)) == sorted(train)
  assert sorted(texts('lm1b', 'test', data_dir)) == sorted(test)
  it = data.make_iterator(
      {'name': 'lm1b', 'data_dir': data_dir}, 'test', ByteTokenizer(),
      batch_size=4, seq_len=64, shuffle=False, num_epochs=1,
      process_index=0, process_count=1, num_threads=1)
  rows = [ByteTokenizer().decode(r) for b in it for r in b['targets']
          if r.any()]
  assert sorted(rows) == sorted(test)


def test_lm1b_wrong_archive_says_so(tmp_path, fake_downloads):
  fake_downloads[LM1B_URL] = write_tgz(tmp_path / 'lm1b.tar.gz',
                                       {'other/file': 'x\n'})
  with pytest.raises(FileNotFoundError, match='not the expected one'):
    datasets.build('lm1b', str(tmp_path / 'tfds'))


# ------------------------------------------------------------------------ WMT


def parallel(prefix: str, pairs) -> dict[str, str]:
  """Line-aligned text files <prefix>.de and <prefix>.en."""
  return {f'{prefix}.de': lines(de for _, de in pairs),
          f'{prefix}.en': lines(en for en, _ in pairs)}


def sgm(sentences, role: str) -> str:
  """newstest SGML: one <seg> a line inside <doc> and <p>."""
  segs = ''.join(f'<seg id="{i + 1}">{s}</seg>\n'
                 for i, s in enumerate(sentences))
  return (f'<{role}set setid="newstest2014" srclang="any">\n'
          f'<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">\n'
          f'<p>\n{segs}</p>\n</doc>\n</{role}set>\n')


def write_fake_wmt(directory, name: str) -> dict[str, object]:
  """The de-en files of the WMT archives; returns {url: archive} + pairs."""
  pairs = data_testing.fake_sentence_pairs(16)
  # Europarl has lines empty on one side; TFDS drops such pairs.
  europarl = pairs[:4] + [('Resumption of the session', '')]
  test_en, test_de = zip(*pairs[13:])
  nc_url, nc_prefix = NEWS_COMMENTARY[name]
  d = str(directory)
  urls = {
      EUROPARL_URL: write_tgz(f'{d}/europarl.tgz', {
          **parallel('training/europarl-v7.de-en', europarl),
          **parallel('training/europarl-v7.fr-en', [('No.', 'Non.')])}),
      COMMONCRAWL_URL: write_tgz(f'{d}/commoncrawl.tgz', {
          **parallel('commoncrawl.de-en', pairs[4:7]),
          'commoncrawl.de-en.annotation': lines(['x'] * 3)}),
      nc_url: write_tgz(f'{d}/nc.tgz', parallel(f'{nc_prefix}.de-en',
                                                 pairs[7:10])),
      DEV_URL: write_tgz(f'{d}/dev.tgz', {
          **parallel('dev/newstest2013', pairs[10:13]),
          'dev/newstest2013.fr': lines(['Non.'] * 3),
          'dev/newstest2014-deen-src.de.sgm': sgm(test_de, 'src'),
          'dev/newstest2014-deen-ref.en.sgm': sgm(test_en, 'ref'),
          'dev/newstest2014-fren-src.fr.sgm': sgm(['Non.'] * 3, 'src')}),
  }
  expected = {'train': set(pairs[:10]), 'validation': set(pairs[10:13]),
              'test': set(pairs[13:])}
  return urls, expected


@pytest.mark.parametrize('name', sorted(NEWS_COMMENTARY))
def test_wmt_prepared_from_fake_archives(tmp_path, fake_downloads, name):
  urls, expected = write_fake_wmt(tmp_path, name)
  fake_downloads.update(urls)
  data_dir = str(tmp_path / 'tfds')
  prepared = data.prepare(name, data_dir, tokenizer='byte')
  assert prepared.num_examples == {k: len(v) for k, v in expected.items()}
  for split, pairs in expected.items():
    got = zip(texts(name, split, data_dir, 'en'),
              texts(name, split, data_dir, 'de'))
    assert set(got) == pairs, split


# ---------------------------------------------------------------------- names


def test_names_build_with_tf_free_builders(tmp_path):
  kwargs = {'data_dir': str(tmp_path), 'file_format': 'array_record'}
  b = builders.builder('wmt14_translate/de-en:1.0.0', **kwargs)
  assert type(b) is wmt.Wmt14Translate and b.builder_config.name == 'de-en'
  assert type(builders.builder('wmt_t2t_translate/de-en', **kwargs)) is (
      wmt.WmtT2tTranslate)
  assert type(builders.builder('lm1b', **kwargs)) is lm1b.Lm1b
  assert not isinstance(builders.builder('tiny_shakespeare', **kwargs),
                        downloads.TfFreeBuilder)
  # Real downloads are still checked against TFDS's recorded checksums.
  assert LM1B_URL in lm1b.Lm1b.url_infos
  assert DEV_URL in wmt.Wmt14Translate.url_infos
  assert EUROPARL_URL in wmt.WmtT2tTranslate.url_infos
