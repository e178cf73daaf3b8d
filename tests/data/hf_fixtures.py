"""Hugging Face datasets and tokenizers made offline, for the tests of
``data.name='huggingface...'`` and ``data.tokenizer_path``."""

import glob
import io
import json
import os
import shutil

import sentencepiece as spm


def hub_cache(cache_dir, repo_id, splits, config=None):
  """A dataset in datasets' cache as a download from the Hub leaves it
  (``<owner>___<name>/<config>/0.0.0/<hash>/``), without the Hub: built by
  datasets' JSON builder from splits {split: [records]}, then moved to the
  place and name a download of repo_id (and config) would have."""
  from datasets.packaged_modules.json.json import Json
  stage = os.path.join(str(cache_dir), '.stage')
  sources = {}
  for split, records in splits.items():
    path = os.path.join(stage, 'src', f'{split}.jsonl')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in records)
    sources[split] = [path]
  owner, name = repo_id.split('/')
  config = config or 'default'
  builder = Json(cache_dir=os.path.join(stage, 'cache'), dataset_name=name,
                 config_name=config, data_files=sources, hash='0123456789abcdef')
  builder.download_and_prepare()
  target = os.path.join(str(cache_dir), f'{owner}___{name}', config, '0.0.0',
                        '0123456789abcdef')
  os.makedirs(os.path.dirname(target), exist_ok=True)
  shutil.copytree(builder.cache_dir, target)
  with open(os.path.join(target, 'dataset_info.json')) as f:
    info = json.load(f)
  info['config_name'] = config  # a download's: no data_files of ours
  with open(os.path.join(target, 'dataset_info.json'), 'w') as f:
    json.dump(info, f)
  for lock in glob.glob(os.path.join(str(cache_dir), '*.lock')):
    os.remove(lock)
  shutil.rmtree(stage)
  return target


def save_to_disk(folder, splits):
  """A DatasetDict of splits {split: {column: values}} saved to folder."""
  import datasets
  datasets.DatasetDict({k: datasets.Dataset.from_dict(v)
                        for k, v in splits.items()}).save_to_disk(str(folder))
  return str(folder)


def spm_model(path, texts, vocab_size=200):
  """A SentencePiece model trained with its own defaults (unk 0, bos 1,
  eos 2, no pad: Llama 2's layout), written to path."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model,
      vocab_size=vocab_size, model_type='unigram', hard_vocab_limit=False,
      minloglevel=2, num_threads=1)
  with open(path, 'wb') as f:
    f.write(model.getvalue())
  return str(path)


def bpe_tokenizer_json(path, texts, special_tokens=('<s>', '</s>'),
                       vocab_size=300):
  """A BPE tokenizer.json trained with the tokenizers library."""
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE(unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  from tokenizers import decoders
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(special_tokens),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False)
  tok.train_from_iterator(texts, trainer)
  os.makedirs(os.path.dirname(str(path)) or '.', exist_ok=True)
  tok.save(str(path))
  return str(path)
