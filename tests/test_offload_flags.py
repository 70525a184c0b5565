"""Resolution of --colocate / --offload / --offload-train / --offload-rollout (seed 000 semantics)."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from relax.utils.validation import _offload

MINIMAL = ["--train-backend", "torch", "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]


@pytest.mark.parametrize(("flags", "train", "rollout"), [
    ([], False, False),  # None resolves to --offload (False)
    (["--offload"], True, True),
    (["--offload-train"], True, False),
    (["--offload-rollout"], False, True),
    (["--offload-train", "--offload-rollout"], True, True),
    (["--colocate"], True, True),  # --colocate implies both
    (["--colocate", "--offload-train"], True, True),
    (["--colocate", "--offload"], True, True),
])
def test_resolution_table(flags: list[str], train: bool, rollout: bool) -> None:
    args = parse_args([*MINIMAL, *flags])
    assert (args.offload_train, args.offload_rollout) == (train, rollout)


def test_quickstart_preset_offloads_both() -> None:
    args = parse_args(["--preset", "quickstart"])
    assert args.colocate and args.offload_train and args.offload_rollout


def test_config_file_can_turn_colocate_off(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("colocate: false\n")
    args = parse_args(["--preset", "quickstart", "--config", str(cfg)])
    assert not args.colocate and not args.offload_train and not args.offload_rollout


@pytest.mark.parametrize("flag", ["--offload", "--offload-train", "--offload-rollout"])
def test_explicit_offload_refused_with_fully_async(flag: str) -> None:
    with pytest.raises(ConfigError, match=f"{flag} has no effect with --fully-async"):
        parse_args([*MINIMAL, "--fully-async", flag])


def test_fully_async_resolves_colocate_offload_off() -> None:
    args = parse_args(["--preset", "quickstart", "--fully-async"])
    assert args.colocate and not args.offload_train and not args.offload_rollout


def _ns(**kw) -> Namespace:
    base = {"colocate": False, "offload": False, "offload_train": None, "offload_rollout": None,
            "fully_async": False, "train_backend": "torch", "optimizer_cpu_offload": False}
    return Namespace(**{**base, **kw})


def test_megatron_colocate_offloads_rollout_only() -> None:
    args = _ns(colocate=True, train_backend="megatron")
    _offload(args)
    assert (args.offload_train, args.offload_rollout) == (False, True)
    args = _ns(offload_rollout=True, train_backend="megatron")
    _offload(args)
    assert (args.offload_train, args.offload_rollout) == (False, True)


@pytest.mark.parametrize("kw", [{"offload": True}, {"offload_train": True}, {"colocate": True, "offload_train": True}])
def test_megatron_offload_train_on_request(kw: dict) -> None:
    """An explicit request offloads the Megatron trainer (relax/backends/megatron/offload.py), with or without
    --colocate; with --optimizer-cpu-offload (its optimizer state is on the CPU already) it is refused."""
    args = _ns(train_backend="megatron", **kw)
    _offload(args)
    assert args.offload_train is True
    with pytest.raises(ConfigError, match="not supported yet: --offload-train with --optimizer-cpu-offload"):
        _offload(_ns(train_backend="megatron", optimizer_cpu_offload=True, **kw))


def test_offload_flags_are_marked_supported() -> None:
    from relax.utils.flag_table import FLAGS_BY_NAME

    assert all(FLAGS_BY_NAME[n].supported for n in ("offload", "offload-train", "offload-rollout"))
