"""--enable-cuda-memory-check (relax/observability/collective_memory.py) on the CPU, with torch.cuda.mem_get_info
faked: each collective relax issues reads the device's free memory first, a failing one raises its own error with
that reading attached (through the weight-update group's re-raise too), the reads are summed up per step into the
trainer's metrics for events.jsonl, and a run without a GPU refuses the flag at launch. The GPU twin:
tests/gpu/test_collective_memory_gpu.py."""

from __future__ import annotations

import pytest
import torch

from relax.backends.torch import data_parallel
from relax.observability import collective_memory
from relax.observability.collective_memory import CollectiveMemoryConfig
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError

GiB = 1 << 30


@pytest.fixture
def check(monkeypatch):
    """This process's check, on, with a device that has 3 GiB of 80 free (then 1 GiB, after a failure)."""
    readings = iter([(3 * GiB, 80 * GiB), (1 * GiB, 80 * GiB)])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: next(readings))
    collective_memory.CHECK.configure(CollectiveMemoryConfig(enable_cuda_memory_check=True), rank=3)
    yield collective_memory.CHECK
    collective_memory.CHECK.configure(CollectiveMemoryConfig(enable_cuda_memory_check=False))


def test_a_failing_gradient_all_reduce_carries_the_free_memory_before_and_after_it(check) -> None:
    # no process group: torch's all_reduce itself raises, as a collective on a broken communicator does
    with pytest.raises(ValueError, match="process group") as failure:
        data_parallel._all_reduce_flat([torch.ones(4)])
    assert failure.value.__notes__ == [
        f"--enable-cuda-memory-check: collective all_reduce(gradients) on rank 3: {3 * GiB} of {80 * GiB} bytes "
        f"free on the device before it, {GiB} of {80 * GiB} bytes free after it failed"]
    assert check.pop_summary() == {"rank": 3, "collectives": {"all_reduce(gradients)": 1}, "min_free_bytes": 3 * GiB,
                                   "total_bytes": 80 * GiB, "min_free_at": "all_reduce(gradients)"}
    assert check.pop_summary() is None  # drained


def test_off_it_reads_nothing_and_adds_nothing(monkeypatch) -> None:
    def never(*a):
        raise AssertionError("mem_get_info read with the check off")

    monkeypatch.setattr(torch.cuda, "mem_get_info", never)
    with pytest.raises(ValueError) as failure:
        data_parallel._all_reduce_flat([torch.ones(4)])
    assert not getattr(failure.value, "__notes__", None)
    assert collective_memory.CHECK.pop_summary() is None


def test_the_weight_groups_broadcast_keeps_the_note_through_its_re_raise(check, monkeypatch) -> None:
    from relax.weights.update_group import WeightUpdateGroup, host_store

    store = host_store("127.0.0.1", 1, 30.0)
    group = WeightUpdateGroup("127.0.0.1", store.port, 0, 1, group_name="g-test", backend="gloo", timeout_s=30.0,
                              store=store)
    try:
        monkeypatch.setattr(group, "_wait", lambda work: (_ for _ in ()).throw(RuntimeError("Connection reset")))
        with pytest.raises(RuntimeError, match="Connection reset") as failure:
            group.broadcast([torch.ones(3)])
        assert failure.value.__notes__[0].startswith(
            f"--enable-cuda-memory-check: collective broadcast(g-test) on rank 0: {3 * GiB} of {80 * GiB} bytes")
    finally:
        group.close()


def test_a_train_step_hands_the_summary_to_the_driver(check) -> None:
    from relax.backends.config import TrainerConfig
    from relax.backends.torch.backend import TorchTrainBackend
    from tests.test_train_loop_flags import BASE, _samples

    backend = TorchTrainBackend(TrainerConfig.from_args(parse_args(BASE)), "cpu")
    with collective_memory.checked("broadcast(relax-weights-x)"):  # the weight push between two steps
        pass
    metrics = backend.train_rollout(_samples(seed=1, n=8), 0)
    assert metrics[collective_memory.SUMMARY_KEY]["collectives"] == {"broadcast(relax-weights-x)": 1}
    assert metrics[collective_memory.SUMMARY_KEY]["min_free_bytes"] == 3 * GiB


def test_a_run_without_a_gpu_refuses_the_flag_at_launch_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:  # relax train prints it and exits 2
        parse_args(["--preset", "quickstart", "--device", "cpu", "--enable-cuda-memory-check"])
    assert err.value.problems == ["--enable-cuda-memory-check needs a CUDA GPU (it reads a CUDA device's free memory "
                                  "around each collective); --device cpu uses none"]


def test_the_flag_reaches_the_trainers_slice_and_turns_the_check_on() -> None:
    """What a trainer rank does at its start (relax/distributed/actors.py) with the parsed flag of a CUDA run."""
    from relax.backends.config import TrainerConfig

    args = parse_args(["--preset", "quickstart", "--device", "cuda", "--train-backend", "torch",
                       "--enable-cuda-memory-check"])
    cfg = TrainerConfig.from_args(args)
    assert cfg.collectives == CollectiveMemoryConfig(enable_cuda_memory_check=True)
    collective_memory.configure(cfg.collectives, rank=1)
    try:
        assert collective_memory.CHECK.enabled and collective_memory.CHECK.rank == 1
    finally:
        collective_memory.configure(CollectiveMemoryConfig(enable_cuda_memory_check=False))
