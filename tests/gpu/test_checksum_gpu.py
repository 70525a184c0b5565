"""The weight checksum is computed on the GPU for GPU tensors and equals the CPU digest of the same bytes."""

from __future__ import annotations

import pytest
import torch

from relax.weights.checksum import tensor_checksum

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 1000, 5_000_003])
def test_gpu_digest_equals_cpu_digest(dtype: torch.dtype, n: int) -> None:
    t = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    assert tensor_checksum(t.cuda()) == tensor_checksum(t)


def test_batched_gpu_digests_equal_cpu_digests() -> None:
    """A sync-sized mix (many small tensors, odd byte counts, a transposed view, some larger than one batch)
    digested on the GPU, by the Triton kernel and by the per-tensor torch path, equals the CPU digest."""
    from relax.weights import checksum as cs

    g = torch.Generator().manual_seed(0)
    sizes = [3, 1024, 7, 4_194_305, 96, 9_000_001] + [2048] * 300
    named = [(f"t{i}", torch.randn(n, generator=g).to(torch.bfloat16 if i % 2 else torch.float32))
             for i, n in enumerate(sizes)]
    named.append(("transposed", torch.randn(33, 17, generator=g).t()))
    on_gpu = [(k, v.cuda()) for k, v in named]
    expected = cs.state_checksums(named)
    assert cs._device_digests(torch.device("cuda")) is not cs._digests  # triton is there: the kernel runs
    assert cs.state_checksums(on_gpu) == expected
    words = [cs._words(v) for _, v in on_gpu]
    assert torch.equal(cs._digests(words), cs._device_digests(torch.device("cuda"))(words))
