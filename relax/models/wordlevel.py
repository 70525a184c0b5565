"""A word-level tokenizer of N synthetic words for GPU benchmarks (MACHINES.md: 32000 words).

Benchmarks feed random token ids; the tokenizer only has to exist, decode and own pad/eos ids.
"""

from __future__ import annotations

from relax.models.tokenizer import CHATML_TEMPLATE, SPECIAL_TOKENS


def build_wordlevel_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for i in range(vocab_size - len(vocab)):
        vocab[f"w{i}"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS[0]))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")
    core.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=SPECIAL_TOKENS[0], eos_token=SPECIAL_TOKENS[2],
                                  unk_token=SPECIAL_TOKENS[0], clean_up_tokenization_spaces=False)
    tok.chat_template = CHATML_TEMPLATE
    return tok
