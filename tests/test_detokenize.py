"""The engine's batched detokenizer (relax/backends/embedded/detokenize.py) returns exactly what
``tokenizer.decode`` returns, whatever the thread split, the special-token flag or the tokenizer."""

from __future__ import annotations

import random

import pytest

from relax.backends.embedded.detokenize import Detokenizer
from relax.models import load_tokenizer


@pytest.mark.parametrize("name", ["tiny-qwen3", "bench-270m"])
@pytest.mark.parametrize("threads", [1, 3])
def test_decode_many_is_tokenizer_decode(name: str, threads: int) -> None:
    tok = load_tokenizer(name)
    rng = random.Random(threads)
    special = sorted(tok.all_special_ids)
    seqs = [[rng.choice(special) if rng.random() < 0.1 else rng.randrange(len(tok)) for _ in range(rng.randrange(0, 900))]
            for _ in range(23)]
    skips = [rng.random() < 0.5 for _ in seqs]
    det = Detokenizer(tok, threads=threads)
    assert det.backend is not None  # the fast path is what runs here
    expected = [tok.decode(s, skip_special_tokens=k) for s, k in zip(seqs, skips, strict=True)]
    assert det.decode_many(seqs, skips) == expected
    assert det.decode_many([], []) == []


def test_a_tokenizer_that_cleans_up_spaces_decodes_one_by_one() -> None:
    class Cleaning:
        clean_up_tokenization_spaces = True
        backend_tokenizer = object()

        def decode(self, ids, skip_special_tokens=False):
            return f"{len(ids)}:{skip_special_tokens}"

    det = Detokenizer(Cleaning())
    assert det.backend is None
    assert det.decode_many([[1, 2], [3]], [True, False]) == ["2:True", "1:False"]
