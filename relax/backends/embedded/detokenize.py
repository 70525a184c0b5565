"""Response texts of many finished requests at once, decoded on several threads.

Why: a GRPO batch finishes its 64 requests in the same decode step, and their texts (64 x 256 tokens)
were decoded one after the other on the engine's thread: ~20 ms on the H100 host (ci/bench_engine_paths.py:
0.029 s to build the 64 responses, 10% of the decode), paid between the last decode step and the answer.
The Rust tokenizer (``tokenizers.Tokenizer.decode_batch``, the fast tokenizer's ``backend_tokenizer``)
releases the GIL while it decodes, so slices of the batch decode in parallel on a small thread pool.
Relax's Ray workers run with ``TOKENIZERS_PARALLELISM=false`` (relax/distributed/cluster.py), which turns
off the tokenizer's own thread pool, hence ours.

The texts are what ``tokenizer.decode(ids, skip_special_tokens=...)`` returns: the backend's decode is what
transformers' decode calls, and it is used only where transformers adds nothing on top of it (no
``clean_up_tokenization_spaces``); other tokenizers decode one by one through ``tokenizer.decode``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MIN_TOKENS_PER_THREAD = 2048  # below this a slice is not worth a thread hand-off (~50 us)


class Detokenizer:
    def __init__(self, tokenizer: Any, threads: int | None = None):
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        plain = not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self.backend = backend if backend is not None and hasattr(backend, "decode_batch") and plain else None
        self.threads = max(1, threads if threads is not None else min(8, os.cpu_count() or 1))
        self._pool: ThreadPoolExecutor | None = None

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_many(self, sequences: list[list[int]], skip_special_tokens: list[bool]) -> list[str]:
        """``[decode(ids, skip) for ids, skip in zip(...)]``, the Rust decodes spread over threads."""
        if self.backend is None:
            return [self.decode(ids, skip) for ids, skip in zip(sequences, skip_special_tokens, strict=True)]
        out: list[str] = [""] * len(sequences)
        for skip in (False, True):
            index = [i for i, s in enumerate(skip_special_tokens) if bool(s) is skip]
            if not index:
                continue
            batch = [sequences[i] for i in index]
            for i, text in zip(index, self._decode_batch(batch, skip), strict=True):
                out[i] = text
        return out

    def _decode_batch(self, batch: list[list[int]], skip: bool) -> list[str]:
        tokens = sum(len(ids) for ids in batch)
        parts = min(self.threads, len(batch), max(1, tokens // MIN_TOKENS_PER_THREAD))
        if parts <= 1:
            return self.backend.decode_batch(batch, skip_special_tokens=skip)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="relax-detokenize")
        size = -(-len(batch) // parts)
        slices = [batch[i:i + size] for i in range(0, len(batch), size)]
        done = self._pool.map(lambda part: self.backend.decode_batch(part, skip_special_tokens=skip), slices)
        return [text for part in done for text in part]
