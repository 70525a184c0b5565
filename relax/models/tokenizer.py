"""Offline tokenizers with a ChatML chat template, built in memory with `tokenizers`.

``char``: one token per printable ASCII character (plus newline and tab) and three special
tokens, 100 ids in all. Digits are single tokens, which the synthetic tasks rely on, and
``decode(encode(s)) == s`` for printable text. Characters outside the vocabulary encode to
the pad/unk id.

``wordlevel-32k``: N synthetic words ``w0 w1 ...`` for the GPU benchmark presets
(MACHINES.md uses a 32000-word WordLevel tokenizer); benchmarks feed token ids, so it only
has to exist, decode and own the same special ids.

Every tokenizer puts the special tokens first, so ``PAD_ID`` and ``EOS_ID`` hold for all presets.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
PAD_ID, IM_START_ID, EOS_ID = 0, 1, 2

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CHARACTERS = [c for c in string.printable if c not in "\r\x0b\x0c"]  # 97: letters, digits, punctuation, space, \n, \t
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARACTERS)


def char_vocab() -> dict[str, int]:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    return vocab


def _wrap(core: Any, model_max_length: int):
    from transformers import PreTrainedTokenizerFast

    core.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=IM_END, unk_token=PAD, bos_token=None,
        clean_up_tokenization_spaces=False, model_max_length=model_max_length,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_char_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A `PreTrainedTokenizerFast` over single characters (no BOS; eos = ``<|im_end|>``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if vocab_size != VOCAB_SIZE:
        raise ValueError(f"the char tokenizer has {VOCAB_SIZE} ids, not {vocab_size}")
    core = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=PAD))
    # one piece per character; "." would glue runs of newlines together (onig has no (?s))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return _wrap(core, model_max_length=4096)


def build_wordlevel_tokenizer(vocab_size: int):
    """``vocab_size`` ids: the special tokens, then words ``w0``, ``w1``, ... split on whitespace."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for i in range(vocab_size - len(vocab)):
        vocab[f"w{i}"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")
    return _wrap(core, model_max_length=32768)


# Qwen-VL's four vision tokens, after the char vocabulary (the tiny VLM's, relax/models/vision.py): an image is
# ``<|vision_start|><|image_pad|>...<|vision_end|>`` in the text, one pad per merged patch
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
VL_VOCAB_SIZE = VOCAB_SIZE + len(VISION_TOKENS)
VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID = range(VOCAB_SIZE, VL_VOCAB_SIZE)


def build_char_vl_tokenizer(vocab_size: int = VL_VOCAB_SIZE):
    """The char tokenizer plus Qwen-VL's four vision tokens (ids 100-103)."""
    if vocab_size != VL_VOCAB_SIZE:
        raise ValueError(f"the char-vl tokenizer has {VL_VOCAB_SIZE} ids, not {vocab_size}")
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    return tok


# Qwen2.5-Omni's three audio tokens, after the vision ones (the tiny omni model, relax/models/omni.py): an audio clip is
# ``<|audio_bos|><|AUDIO|>...<|audio_eos|>`` in the text, one ``<|AUDIO|>`` per audio-tower output frame
AUDIO_START, AUDIO_END, AUDIO_PAD = "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>"
AUDIO_TOKENS = [AUDIO_START, AUDIO_END, AUDIO_PAD]
OMNI_VOCAB_SIZE = VL_VOCAB_SIZE + len(AUDIO_TOKENS)
AUDIO_START_ID, AUDIO_END_ID, AUDIO_PAD_ID = range(VL_VOCAB_SIZE, OMNI_VOCAB_SIZE)


def build_char_omni_tokenizer(vocab_size: int = OMNI_VOCAB_SIZE):
    """The char-vl tokenizer plus Qwen2.5-Omni's three audio tokens (ids 104-106)."""
    if vocab_size != OMNI_VOCAB_SIZE:
        raise ValueError(f"the char-omni tokenizer has {OMNI_VOCAB_SIZE} ids, not {vocab_size}")
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS + AUDIO_TOKENS})
    return tok


TOKENIZERS: dict[str, Callable[[int], Any]] = {
    "char": build_char_tokenizer,
    "char-vl": build_char_vl_tokenizer,  # char + Qwen-VL's vision tokens (the tiny VLM, relax/models/vision.py)
    "char-omni": build_char_omni_tokenizer,  # char-vl + Qwen2.5-Omni's audio tokens (relax/models/omni.py)
    "wordlevel-32k": build_wordlevel_tokenizer,
}


def build_tokenizer(kind: str, *, vocab_size: int):
    try:
        factory = TOKENIZERS[kind]
    except KeyError:
        raise ValueError(f"unknown tokenizer {kind!r}; known: {', '.join(TOKENIZERS)}") from None
    return factory(vocab_size)
