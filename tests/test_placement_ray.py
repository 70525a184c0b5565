"""`Placement.reserve` on a real (in-process, one-node) Ray cluster that declares two logical GPUs.

The slots' options put actors into their bundles (colocated halves share a GPU id, separate roles get
their own), the reservation is released at shutdown, and GPUs held by someone else make it fail after
its timeout with one line instead of waiting forever.
"""

from __future__ import annotations

import logging

import pytest
import ray

from relax.core.fault_tolerance import wait_for
from relax.distributed.config import PlacementConfig
from relax.distributed.placement import Placement, gpu_ids, where
from relax.distributed.resources import plan_resources
from relax.utils.flag_types import ConfigError
from tests.e2e_helpers import _ray_dir

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def two_gpu_ray(tmp_path_factory):
    ray.init(address="local", num_cpus=1, num_gpus=2, include_dashboard=False, logging_level=logging.WARNING,
             _temp_dir=str(_ray_dir(tmp_path_factory.mktemp("ray"))))
    yield
    ray.shutdown()


@ray.remote
class Probe:
    def gpu_ids(self) -> list[str]:
        return [str(i) for i in ray.get_runtime_context().get_accelerator_ids()["GPU"]]

    def env(self, *names: str) -> list[str | None]:
        import os

        return [os.environ.get(name) for name in names]


def _plan(resource: dict, colocate: bool, device: str = "cuda", per_engine: int = 1):
    return plan_resources(PlacementConfig(resource=resource, colocate=colocate, rollout_num_gpus_per_engine=per_engine,
                                    num_gpus_per_node=8, debug_train_only=False, debug_rollout_only=False,
                                    rollout_external=False, train_env_vars={}), device)


def _gpu(slot) -> list[str]:
    actor = Probe.options(**slot.options).remote()
    try:
        assert where(actor)["node_id"] == slot.node_id
        return ray.get(actor.gpu_ids.remote())
    finally:
        ray.kill(actor)


def test_colocated_ranks_share_their_engines_gpus(two_gpu_ray) -> None:
    placement = Placement.reserve(_plan({"actor": [1, 2], "rollout": [1, 2]}, colocate=True), timeout_s=30)
    try:
        ranks = [_gpu(s) for s in placement.trainer_ranks]
        engines = [_gpu(s) for s in placement.engines]
        assert ranks == engines and len({tuple(r) for r in ranks}) == 2  # rank i with engine i, two GPUs
        assert placement.describe() == [{"role": "actor+rollout", "bundles": [1, 1],
                                         "node_id": placement.trainer_ranks[0].node_id}]
    finally:
        placement.release()
    assert wait_for(lambda: ray.available_resources().get("GPU") == 2, timeout=30)  # released (asynchronously)


def test_a_colocated_engine_of_two_gpus_learns_both_after_the_ranks_took_their_halves(two_gpu_ray) -> None:
    """Ray gives an actor one bundle's GPU: the engine's other GPU comes from `gpu_ids`' probes, asked while the
    two trainer ranks hold half of each GPU; they are the ranks' GPUs, in bundle order."""
    placement = Placement.reserve(_plan({"actor": [1, 2], "rollout": [1, 2]}, colocate=True, per_engine=2),
                                  timeout_s=30)
    ranks = [Probe.options(**s.options).remote() for s in placement.trainer_ranks]
    try:
        rank_gpus = [ray.get(r.gpu_ids.remote())[0] for r in ranks]
        (engine,) = placement.engines
        assert engine.gpus == 2 and len(engine.span) == 2 and placement.trainer_ranks[0].span == ()
        assert gpu_ids(engine, timeout_s=30) == rank_gpus and len(set(rank_gpus)) == 2
        assert _gpu(engine) == rank_gpus[:1]  # its actor: the first bundle's half
        server = Probe.options(**engine.options).remote()
        ray.get(server.__ray_call__.remote(lambda self: setattr(self, "compute_gpus", rank_gpus)))
        assert where(server)["gpu_ids"] == rank_gpus  # what its process_started event reports: both
        ray.kill(server)
    finally:
        for r in ranks:
            ray.kill(r)
        placement.release()
    assert wait_for(lambda: ray.available_resources().get("GPU") == 2, timeout=30)


def test_every_slot_carries_the_worker_env(two_gpu_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster here was started without any runtime_env: what the actors see comes from their slots
    (on a joined cluster the same options carry it to every node). RELAX_PROBE appears after Ray started."""
    monkeypatch.setenv("RELAX_PROBE", "from-the-driver")
    placement = Placement.reserve(_plan({"actor": [1, 1], "rollout": [2, 0]}, colocate=False, device="cpu"),
                                  timeout_s=30)
    try:
        for slot in (*placement.trainer_ranks, *placement.engines):  # a GPU slot and CPU slots
            actor = Probe.options(**slot.options).remote()
            names = ("RELAX_PROBE", "OMP_NUM_THREADS", "HF_HUB_OFFLINE")
            assert ray.get(actor.env.remote(*names)) == ["from-the-driver", "1", "1"], slot.name
            ray.kill(actor)
    finally:
        placement.release()


def test_gpus_held_elsewhere_fail_after_the_timeout(two_gpu_ray) -> None:
    from ray.util.placement_group import placement_group, remove_placement_group

    assert wait_for(lambda: ray.available_resources().get("GPU") == 2, timeout=30)  # earlier tests' groups gone
    held = placement_group([{"GPU": 1.0}])
    ray.get(held.ready())
    try:
        with pytest.raises(ConfigError, match=r"^--resource: the cluster did not grant 2 GPUs for actor\+rollout "
                                              r"within 2 s: 1 of its 2 GPUs were free when it asked \(other jobs"):
            Placement.reserve(_plan({"actor": [1, 1], "rollout": [1, 1]}, colocate=False), timeout_s=2)
    finally:
        remove_placement_group(held)
    placement = Placement.reserve(_plan({"actor": [1, 1], "rollout": [1, 1]}, colocate=False), timeout_s=30)
    try:  # the failed attempt left nothing reserved: both GPUs are there again, one per role
        assert sorted(_gpu(s)[0] for s in (*placement.trainer_ranks, *placement.engines)) == ["0", "1"]
    finally:
        placement.release()
