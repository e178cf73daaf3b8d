"""The token ids every tokenizer of this package reserves, and decoding
assumes by default: padding, begin and end of sequence, unknown.

One home for them: ``data.tokenizers`` builds vocabularies around them and
``decoding`` pads, starts and stops with them.
"""

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
NUM_RESERVED = 4  # ids below this are the control ids above
