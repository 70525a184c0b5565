"""--checkpoint-engine-backend: the weight-update group's collective for GPU weights, nccl (the default) or gloo (each
bucket through the trainer's host memory); host weights always go over gloo; other values are refused."""

from __future__ import annotations

import asyncio

import pytest
import torch

from relax.utils.arguments import parse_args
from relax.utils.flag_table import FLAGS_BY_NAME
from relax.utils.flag_types import ConfigError
from relax.weights.transports import distributed
from relax.weights.transports.distributed import DistributedTransport, group_backend
from tests.test_train_loop_flags import BASE


def test_nccl_is_the_default_and_gloo_is_accepted() -> None:
    assert parse_args(BASE).checkpoint_engine_backend == "nccl"
    assert parse_args([*BASE, "--checkpoint-engine-backend", "gloo"]).checkpoint_engine_backend == "gloo"
    assert FLAGS_BY_NAME["checkpoint-engine-backend"].supported_values == {"nccl", "gloo"}


def test_other_backends_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_args([*BASE, "--checkpoint-engine-backend", "p2p"])
    assert info.value.problems == ["not supported yet: --checkpoint-engine-backend p2p"]


def test_the_flag_picks_the_collective_of_the_group_the_pusher_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU weights: an NCCL group, or a gloo one with gloo; host weights: gloo either way. The transport builds the
    group it chose (its GPU twin, tests/gpu/test_weight_push_gpu.py, pushes through a gloo group bitwise)."""
    gpu, host = torch.device("cuda", 0), torch.device("cpu")
    assert [group_backend(b, gpu) for b in ("nccl", "gloo")] == ["nccl", "gloo"]
    assert [group_backend(b, host) for b in ("nccl", "gloo")] == ["gloo", "gloo"]
    with pytest.raises(ValueError, match="'p2p': one of nccl, gloo"):
        group_backend("p2p", gpu)

    built: list[str] = []

    class Group:
        def __init__(self, *args, backend: str, **kwargs) -> None:
            built.append(backend)

    monkeypatch.setattr(distributed, "WeightUpdateGroup", Group)
    for requested in ("nccl", "gloo"):
        transport = DistributedTransport([], timeout_s=5, group_backend=requested)
        asyncio.run(transport.open(gpu))  # a group of the trainer alone: its backend is what the flag chose
    assert built == ["nccl", "gloo"]
