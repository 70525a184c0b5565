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
