"""The weight checksum: equal bytes give equal digests, any one-word change is always detected, and
the torch (wrapping int64) computation equals an exact big-integer reference, so CPU and GPU agree."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.weights import checksum as cs

MASK = (1 << 64) - 1


def reference_digest(t: torch.Tensor) -> tuple[int, int]:
    """The documented formula with Python integers (no wrapping anywhere, reduced at the end)."""
    a = b = 0
    for i, word in enumerate(cs._words(t).tolist()):
        w = word & MASK
        m = w ^ (w >> 31)
        a += m * ((((i * 0x9E3779B97F4A7C15) + 0x632BE59BD9B4E019) & MASK) | 1)
        b += m * ((((i * 0xC2B2AE3D27D4EB4F) + 0x165667B19E3779F9) & MASK) | 1)
    return a & MASK, b & MASK


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.float16]),
       seed=st.integers(0, 2**16))
def test_digest_equals_the_big_integer_reference(n: int, dtype: torch.dtype, seed: int) -> None:
    t = (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 50).to(dtype)
    a, b = reference_digest(t)
    assert cs.tensor_checksum(t).split(":")[1] == f"{a:016x}{b:016x}"


def test_batched_state_checksums_equal_one_tensor_at_a_time() -> None:
    g = torch.Generator().manual_seed(1)
    named = [("w", torch.randn(7, 3, generator=g)), ("empty", torch.zeros(0)), ("h", torch.randn(5, generator=g).half()),
             ("i", torch.arange(9, dtype=torch.int8))]
    assert cs.state_checksums(named) == {name: cs.tensor_checksum(t) for name, t in named}
    assert cs.state_checksums(named)["empty"] == "float32[0]:" + "0" * 32


def test_chunking_does_not_change_the_digest(monkeypatch) -> None:
    t = torch.randn(1000)
    whole = cs.tensor_checksum(t)
    monkeypatch.setattr(cs, "_CHUNK", 7)
    assert cs.tensor_checksum(t) == whole


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 64), index=st.integers(0, 10_000), bit=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_any_single_bit_flip_changes_both_halves(n: int, index: int, bit: int, seed: int) -> None:
    t = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    raw = t.clone().view(torch.uint8)
    raw[index % raw.numel()] ^= 1 << bit
    before, after = cs.tensor_checksum(t).split(":")[1], cs.tensor_checksum(raw.view(torch.float32)).split(":")[1]
    assert before[:16] != after[:16] and before[16:] != after[16:]


def test_format_names_dtype_and_shape() -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    s = cs.tensor_checksum(t)
    assert s.startswith("float32[2,3]:") and len(s.split(":")[1]) == 32 and s == cs.tensor_checksum(t.clone())
    assert cs.tensor_checksum(t.bfloat16()).startswith("bfloat16[2,3]:")
    assert cs.tensor_checksum(t.t()) != s  # same values, other shape and byte order
    assert cs.tensor_checksum(torch.empty(0)) == "float32[0]:" + "0" * 32


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=8), chunk=st.integers(1, 50), seed=st.integers(0, 2**16))
def test_several_tensors_chunked_at_any_word_equal_the_reference(sizes: list[int], chunk: int, seed: int) -> None:
    """Several tensors digested in one call, each cut into chunks at any word."""
    g = torch.Generator().manual_seed(seed)
    named = [(f"t{i}", torch.randn(n, generator=g)) for i, n in enumerate(sizes)]
    old = cs._CHUNK
    cs._CHUNK = chunk
    try:
        got = cs.state_checksums(named)
    finally:
        cs._CHUNK = old
    for name, t in named:
        a, b = reference_digest(t) if t.numel() else (0, 0)
        assert got[name].split(":")[1] == f"{a:016x}{b:016x}", name


def test_warm_up_digests_a_tiny_tensor_on_the_device(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(cs, "state_checksums", lambda named: seen.extend(named) or {})
    cs.warm_up("cpu")
    assert [(name, t.device.type, t.numel()) for name, t in seen] == [("warm-up", "cpu", 2)]
