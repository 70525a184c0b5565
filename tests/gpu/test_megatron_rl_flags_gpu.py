"""The Megatron backend's RL-loop and overlap flags on one GPU (bf16): the checks of tests/megatron_rl_flag_checks.py
(which says what each observes) on backends built in this process. Skipped with a reason without CUDA or
megatron-core; the same checks run on gloo CPU workers in tests/test_megatron_rl_flags_cpu.py.
"""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.megatron.checks import module_available
from tests import megatron_rl_flag_checks as checks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.megatron,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core"),
]


def _backend(*extra: str):
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.utils.arguments import parse_args

    return MegatronTrainBackend(TrainerConfig.from_args(parse_args(checks.flags(*extra))), "cuda")


@pytest.mark.parametrize("check", checks.CHECKS)
def test_megatron_rl_flag(mcore, check: str) -> None:
    getattr(checks, check)(_backend)
