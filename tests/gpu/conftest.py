"""Each GPU test module starts with torch.compile's caches empty, as a trainer process does.

megatron-core compiles its SwiGLU and bias-dropout-add fusions with ``torch.compile``. In one pytest
process every module's models (other sizes, grad and no-grad passes) add guards to the same compiled
functions until dynamo's recompile limit is reached; past it, new shapes run eagerly, whose bf16
rounding differs from the fused kernel's. A test that needs the no-grad log-prob pass and the
training forward to agree bitwise (step-0 ``ppo_kl`` = 0) then failed depending on which modules ran
before it (seen on the H100: 7.2e-5 after the arch-flags module).
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _fresh_compile_caches():
    try:
        import torch._dynamo
    except ImportError:  # a torch without dynamo compiles nothing
        yield
        return
    torch._dynamo.reset()
    yield


@pytest.fixture(scope="module")
def mcore():
    """megatron-core's parallel state as a world of one, for the one-GPU Megatron modules."""
    from tests.megatron_helpers import init_one_rank

    init_one_rank()
