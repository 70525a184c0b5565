"""Data-parallel invariance of the torch backend: two gloo ranks train exactly what one trainer does.

Each rank runs its round-robin share of every optimizer step's micro-batches and the gradients
are summed (relax/backends/torch/data_parallel.py), so DP = 2 must reproduce DP = 1's metrics and
weights up to float summation order, with fixed and token-packed micro-batches, with a rank that
gets no micro-batch at all, with the per-token loss, and with the PPO critic. Both ranks must also
end with bitwise-identical weights (the weights are replicated; rank 0 alone syncs them).
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from relax.backends.config import TrainerConfig
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.data_parallel import DataParallel
from relax.utils.arguments import parse_args
from tests.metric_helpers import no_timings
from tests.test_train_loop_flags import BASE, _samples

CONFIGS = {
    "fixed": [],  # global batch 8, micro-batch 4: one micro-batch per rank per optimizer step
    "packed": ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "20"],
    "idle-rank": ["--micro-batch-size", "8"],  # one micro-batch per step: rank 1 runs none and adds zeros
    "per-token": ["--calculate-per-token-loss", "--micro-batch-size", "2"],
    "ppo-critic": ["--advantage-estimator", "ppo", "--critic-lr", "1e-3", "--kl-coef", "0.0"],
    # --balance-data: micro-batches dealt by Karmarkar-Karp on their token counts instead of round robin
    "balanced": ["--balance-data", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "20"],
}
ROLLOUTS = 2
TOL = 1e-10  # weights of float64 models: summation order moves them by ~1e-15
METRIC_TOL = 1e-6  # the logged metrics are reduced in float32


def _train(flags: list[str]) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    backend = _float64(TorchTrainBackend(TrainerConfig.from_args(parse_args([*BASE, *flags])), "cpu"))
    metrics = [backend.train_rollout(_samples(seed=10 + step), step) for step in range(ROLLOUTS)]
    return metrics, {k: v.detach().clone() for k, v in backend.model.state_dict().items()}


def _float64(backend: TorchTrainBackend) -> TorchTrainBackend:
    """The models in float64 (in place: the optimizers keep their parameters). In float32, Adam's first step
    (m / sqrt(v), about sign(g)) turns the summation-order noise of a near-zero gradient into weight differences
    of ~1e-6; in float64 that noise is ~1e-15, so the comparison below can be tight enough to catch a real error."""
    for model in (backend.model, backend.ref_model, backend.critic and backend.critic.model):
        if model is not None:
            model.double()
    return backend


def _rank(rank: int, world_size: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.save({name: _train(flags) for name, flags in CONFIGS.items()}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def dp2_results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("dp2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(2, port, str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_two_ranks_train_what_one_trainer_trains(dp2_results, config: str) -> None:
    torch.set_num_threads(1)
    ref_metrics, ref_weights = _train(CONFIGS[config])
    metrics, weights = dp2_results[0][config]
    assert len(metrics) == ROLLOUTS and metrics[0].keys() == ref_metrics[0].keys()
    for step, (got, want) in enumerate(zip(metrics, ref_metrics, strict=True)):
        for key in (k for k in want if not k.startswith("perf/")):  # phase timings differ run to run
            assert abs(got[key] - want[key]) <= METRIC_TOL * max(1.0, abs(want[key])), f"step {step} {key}: {got[key]} vs {want[key]}"
    for name, want in ref_weights.items():
        diff = float((weights[name] - want).abs().max())
        assert diff < TOL, f"{name}: max |DP2 - DP1| = {diff}"
    initial = _initial_weights(config)
    assert any(not torch.equal(weights[name], initial[name]) for name in initial), \
        "the weights did not move: the comparison would prove nothing"


@pytest.mark.parametrize("config", list(CONFIGS))
def test_ranks_stay_bitwise_replicated(dp2_results, config: str) -> None:
    (m0, w0), (m1, w1) = dp2_results[0][config], dp2_results[1][config]
    assert [no_timings(m) for m in m0] == [no_timings(m) for m in m1]
    for name in w0:
        assert torch.equal(w0[name], w1[name]), name


def _initial_weights(config: str) -> dict[str, torch.Tensor]:
    backend = _float64(TorchTrainBackend(TrainerConfig.from_args(parse_args([*BASE, *CONFIGS[config]])), "cpu"))
    return backend.model.state_dict()


def test_round_robin_shares_cover_every_micro_batch_once() -> None:
    slices = [slice(i, i + 1) for i in range(7)]
    shares = [DataParallel(rank, 3).mine(slices) for rank in range(3)]
    assert shares == [slices[0::3], slices[1::3], slices[2::3]]
    assert sorted(s.start for share in shares for s in share) == list(range(7))
    assert DataParallel().mine(slices) == slices


def test_a_lone_rank_needs_no_process_group() -> None:
    dp = DataParallel.current()
    assert (dp.rank, dp.size) == (0, 1)
    rows = torch.ones(2, 3)
    assert dp.sum_rows(rows) is rows and dp.merge_metrics({"a": torch.tensor(1.0)}) == {"a": torch.tensor(1.0)}


def test_balanced_shares_cover_every_micro_batch_once_and_even_out_tokens() -> None:
    from relax.backends.torch.balance import karmarkar_karp

    costs = [100, 1, 1, 1, 100, 1, 1, 1]
    slices = [slice(i, i + 1) for i in range(8)]
    shares = [DataParallel(rank, 2).mine(slices, costs) for rank in range(2)]
    assert sorted(s.start for share in shares for s in share) == list(range(8))
    assert [sum(costs[s.start] for s in share) for share in shares] == [103, 103]  # round robin: 202 and 4
    assert karmarkar_karp([8, 7, 6, 5, 4], 2) == [[1, 3, 4], [0, 2]]  # 16 / 14: the differencing method's split
    assert karmarkar_karp([], 3) == [[], [], []] and DataParallel().mine(slices, costs) == slices
