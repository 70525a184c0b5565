"""--checkpoint-engine-backend: nccl (the distributed weight-sync transport's broadcast) is built; others refused."""

from __future__ import annotations

import pytest

from relax.utils.arguments import parse_args
from relax.utils.flag_table import FLAGS_BY_NAME
from relax.utils.flag_types import ConfigError
from tests.test_train_loop_flags import BASE


def test_nccl_is_the_default_and_accepted() -> None:
    assert parse_args(BASE).checkpoint_engine_backend == "nccl"
    assert parse_args([*BASE, "--checkpoint-engine-backend", "nccl"]).checkpoint_engine_backend == "nccl"
    assert FLAGS_BY_NAME["checkpoint-engine-backend"].supported_values == {"nccl"}


@pytest.mark.parametrize("value", ["gloo", "p2p"])
def test_other_backends_are_refused_in_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_args([*BASE, "--checkpoint-engine-backend", value])
    assert info.value.problems == [f"not supported yet: --checkpoint-engine-backend {value}"]
