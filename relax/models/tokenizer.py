"""An offline character-level tokenizer with a ChatML chat template.

Built in memory with the `tokenizers` library, so no file or hub is needed: one token per
printable ASCII character plus newline and tab, and three special tokens. Digits are single
tokens, which is what the synthetic tasks rely on.
"""

from __future__ import annotations

import string

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CHARACTERS = [c for c in string.printable if c not in "\r\x0b\x0c"]  # 97 characters incl. space, \n, \t


def char_vocab() -> dict[str, int]:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    return vocab


VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARACTERS)


def build_char_tokenizer():
    """Return a `PreTrainedTokenizerFast` over single characters (pad/eos ids are fixed)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=IM_END,
        unk_token=PAD,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok
