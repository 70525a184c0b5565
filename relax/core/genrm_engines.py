"""The GenRM judge's engines (``--genrm-model-path``): started with the run's embedded launcher, never synced.

``--genrm-num-gpus`` engines (``--genrm-num-gpus-per-engine`` is 1: one embedded engine per GPU) over
``--genrm-model-path``, each an `EngineActor` like the rollout engines (relax/core/engine_launchers.py). On CUDA
they get their own STRICT_PACK placement group of one-GPU bundles, apart from the run's (``--resource``) GPUs; on
CPU each is a CPU actor. The judge's weights are its checkpoint's (a random-init preset: built with ``--seed``);
no weight sync ever reaches them, and they are not behind the run's router. Each engine's start is an event
``process_started`` with role ``genrm:<i>`` (so a harness fault can aim at it); a judge engine that dies fails the
run at its next scoring request (relax/engine/rewards/genrm.py), it is not restarted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax.backends.embedded.config import EmbeddedEngineConfig
from relax.engine.launcher import EngineRecord
from relax.engine.rewards.genrm import GenRMError, set_judges
from relax.engine.rewards.genrm_config import GenRMConfig
from relax.utils.flag_types import ConfigError

RESERVE_TIMEOUT_S = 60.0


@dataclass
class GenRMEngines:
    records: list[EngineRecord]
    group: Any = None  # the Ray placement group of the judge's GPUs (None on CPU)
    urls: list[str] = field(default_factory=list)

    def stop(self) -> None:
        import ray

        set_judges([])
        for r in self.records:
            try:
                ray.kill(r.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.group)
            except Exception:  # noqa: BLE001 - already gone with the job
                pass
            self.group = None


def judge_engine_config(cfg: GenRMConfig, engine_cfg: EmbeddedEngineConfig) -> EmbeddedEngineConfig:
    """The rollout engines' slice with the judge's model and context length: request slots for a step's samples,
    the run's runner and dtype, no train-identical log-probs (the judge's log-probs are never trained on)."""
    return engine_cfg.replace(hf_checkpoint=cfg.genrm_model_path, true_on_policy_mode=False,
                              rollout_max_context_len=cfg.engine("max_total_tokens"))


def _slots(cfg: GenRMConfig, device: str) -> tuple[list, Any]:
    from relax.distributed.cluster import worker_env
    from relax.distributed.placement import Slot

    env = {"env_vars": worker_env()}
    n = cfg.num_engines
    if device != "cuda":
        return [Slot(f"genrm:{i}", 0, {"num_cpus": 0, "runtime_env": env}, None) for i in range(n)], None
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"GPU": 1.0}] * n, strategy="STRICT_PACK", name="relax-genrm")
    ready, _ = ray.wait([group.ready()], timeout=RESERVE_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        raise ConfigError(f"--genrm-num-gpus {cfg.genrm_num_gpus}: the cluster did not grant the GenRM judge's "
                          f"GPUs (on one node, beside the run's --resource GPUs) within {RESERVE_TIMEOUT_S:.0f} s")
    node = placement_group_table(group)["bundles_to_node_id"][0]
    slots = [Slot(f"genrm:{i}", 1, {"num_cpus": 0, "num_gpus": 1.0, "runtime_env": env, "scheduling_strategy":
                                    PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)}, node)
             for i in range(n)]
    return slots, group


def start_genrm(cfg: GenRMConfig, engine_cfg: EmbeddedEngineConfig, device: str, artifacts: Any) -> GenRMEngines:
    """Start the judge engines (Ray is up), wait until they serve, register them with the judge."""
    from relax.core.engine_launchers import EmbeddedLauncher
    from relax.core.engines import _bind
    from relax.distributed.placement import where

    slots, group = _slots(cfg, device)
    host, api_key = _bind()
    launcher = EmbeddedLauncher(judge_engine_config(cfg, engine_cfg), device, slots, host=host, api_key=api_key)
    engines = GenRMEngines([], group)
    try:
        engines.records = launcher.start_all(list(range(cfg.num_engines)))
    except Exception as exc:
        engines.stop()
        raise GenRMError(f"GenRM judge engines over --genrm-model-path {cfg.genrm_model_path} did not start: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    engines.urls = [r.target.url for r in engines.records]
    for r in engines.records:
        artifacts.event("process_started", role=f"genrm:{r.index}", url=r.target.url, **where(r.actor))
    set_judges(engines.urls, api_key)
    return engines
