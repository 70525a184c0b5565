"""The Megatron backend's RL-loop and overlap flags on a gloo CPU worker (megatron-core with tests/megatron_workers.py's
shims): the checks of tests/megatron_rl_flag_checks.py, each in its own spawned one-rank worker. Needs megatron-core
(marker ``megatron``; CI without it skips). The GPU twin is tests/gpu/test_megatron_rl_flags_gpu.py.
"""

from __future__ import annotations

import pytest

from relax.backends.config import TrainerConfig
from relax.backends.megatron.checks import module_available
from tests import megatron_rl_flag_checks as checks

pytestmark = [pytest.mark.megatron,
              pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core")]

NO_FUSIONS = ("--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion")  # compiled for CUDA


def _cpu_backend(*extra: str):
    from relax.backends.megatron import checks as machine
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.utils.arguments import parse_args

    machine._cuda_available = lambda: True  # parse as on the GPU machine; the worker runs megatron on the CPU
    return MegatronTrainBackend(TrainerConfig.from_args(parse_args(checks.flags(*NO_FUSIONS, *extra))), "cpu")


def _run(rank: int, check: str) -> str:
    getattr(checks, check)(_cpu_backend)
    return check


@pytest.mark.parametrize("check", checks.CHECKS)
def test_megatron_rl_flag_on_gloo(check: str) -> None:
    from tests.megatron_workers import spawn

    assert spawn(_run, 1, check) == check
