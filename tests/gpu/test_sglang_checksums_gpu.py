"""relax's restatement of SGLang 0.5.14's ``gpu_tensor_hash`` against SGLang's own kernel on the GPU.

SGLang's ``sglang/srt/layers/multimodal.py`` imports only torch and triton, so it is loaded as a file from the
installed SGLang (``RELAX_SGLANG_PYTHONPATH``, as relax's launcher finds it; ci/wheelhouse/install_sglang.sh
puts it at /tmp/sglsite). The CPU twin (tests/test_sglang_checksums.py) checks the same function against
SGLang's answers written by its kernels under the Triton interpreter.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from relax.weights import sglang_checksums as sc

SITE = Path(os.environ.get("RELAX_SGLANG_PYTHONPATH", "/tmp/sglsite"))
SOURCE = SITE / "sglang/srt/layers/multimodal.py"

pytestmark = [pytest.mark.gpu, pytest.mark.sglang,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(not SOURCE.exists(), reason=f"needs SGLang 0.5.14 at {SITE} (RELAX_SGLANG_PYTHONPATH)")]


def _sglang():
    spec = importlib.util.spec_from_file_location("sglang_multimodal", SOURCE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype,numel", [(torch.bfloat16, 1), (torch.uint8, 7), (torch.float32, 8192),
                                         (torch.bfloat16, 3 * 8192 + 5), (torch.bfloat16, 151_936 * 64),
                                         (torch.float32, 5_000_003)])
def test_relax_hashes_as_sglangs_kernel_does_on_the_gpu(dtype, numel) -> None:
    gen = torch.Generator(device="cuda").manual_seed(numel)
    raw = torch.randint(0, 256, (numel * torch.empty(0, dtype=dtype).element_size(),), generator=gen,
                        device="cuda", dtype=torch.uint8)
    t = raw.view(dtype)
    assert sc.tensor_hash(t) == _sglang().gpu_tensor_hash(t)
