"""--disable-weights-backuper: the trainer keeps no host copy of the last sync; refused where one is needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from relax.core.runtime import Runtime
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from tests.test_train_loop_flags import BASE


def _keeps(*, fault_tolerance: bool, joiners: bool, disabled: bool) -> bool:
    args = parse_args(BASE)  # then the combination as given (validation would refuse some of them)
    args.use_fault_tolerance, args.disable_weights_backuper = fault_tolerance, disabled
    scaler = SimpleNamespace(cfg=SimpleNamespace(keeps_snapshot=joiners))
    rt = Runtime(args, None, None, None, None, scaler=scaler)
    return rt.push_options.keep_snapshot


def test_the_snapshot_is_kept_only_without_the_flag() -> None:
    assert _keeps(fault_tolerance=True, joiners=False, disabled=False)
    assert _keeps(fault_tolerance=False, joiners=True, disabled=False)
    assert not _keeps(fault_tolerance=False, joiners=False, disabled=False)
    for ft, joiners in ((True, False), (False, True), (False, False)):
        assert not _keeps(fault_tolerance=ft, joiners=joiners, disabled=True)


def test_accepted_alone() -> None:
    assert parse_args([*BASE, "--disable-weights-backuper"]).disable_weights_backuper is True


@pytest.mark.parametrize(("flags", "message"), [
    (["--use-fault-tolerance"], "--disable-weights-backuper with --use-fault-tolerance: a restarted engine is given "
                                "the last sync's weights from the trainer's host copy, which the flag turns off"),
    (["--fleet-control-addr", "127.0.0.1:0"], "--disable-weights-backuper with --fleet-control-addr: a joining engine"),
    (["--autoscaler-config", "relax/utils/autoscaler/autoscaler.yaml"],
     "--disable-weights-backuper with --autoscaler-config: an engine the autoscaler adds"),
])
def test_refused_with_what_needs_the_copy(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_args([*BASE, "--disable-weights-backuper", *flags])
    assert any(problem.startswith(message) for problem in info.value.problems), info.value.problems
