"""How engines come to exist: one typed launcher class per kind, looked up by `launcher_class`.

* ``embedded``: our engine in a Ray actor (relax/distributed/engine_actor.py);
* ``sglang``: a real SGLang server started by a Ray actor (relax/backends/sglang/launcher.py);
* ``external``: servers the user started (``--rollout-external --rollout-external-engine-addrs``),
  embedded or SGLang, which the run drives but cannot restart.

A launcher starts engines in two halves (`begin` without waiting, `finish` once they serve), so the
trainer loads while the engines do; the base class is relax/engine/launcher.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from relax.backends.embedded.config import EmbeddedEngineConfig
from relax.backends.sglang.launcher import SGLangLauncher
from relax.engine.launcher import EngineLauncher, EngineRecord
from relax.engine.rollout.engine_client import EngineClient, EngineError
from relax.models.registry import key_value_heads
from relax.utils.flag_slice import FlagSlice
from relax.utils.flag_types import ConfigError
from relax.utils.http_utils import run_closing
from relax.weights.transports import SyncTarget


class EmbeddedLauncher(EngineLauncher):
    name = "embedded"
    config_class = EmbeddedEngineConfig
    batches_media = True  # one prefill for a batch's pictures; one request each was 14x slower (VLM run, H200)

    def count(self) -> int:
        return len(self.slots)

    def begin(self, indices: list[int]) -> Any:
        from relax.distributed.engine_actor import EngineActor

        return indices, [EngineActor.options(**self.slots[i].options).remote(self.cfg, self.device, i, self.host,
                                                                             self.api_key) for i in indices]

    def finish(self, pending: Any) -> list[EngineRecord]:
        indices, actors = pending
        answers = ray.get([a.endpoint.remote() for a in actors])
        pids = ray.get([a.pid.remote() for a in actors])
        return [EngineRecord(i, SyncTarget(f"engine:{i}", url, device, api_key=self.api_key, host_tensors=True),
                             actor, pid)
                for i, actor, (url, device), pid in zip(indices, actors, answers, pids, strict=True)]


ATTACH_TIMEOUT_S = 10.0
"""How long attaching an external engine waits for its ``/server_info`` (it is up already, or the run fails)."""


@dataclass(frozen=True)
class ExternalEnginesConfig(FlagSlice):
    rollout_external_engine_addrs: list[str] | None  # HOST:PORT (or a URL) of each engine the user runs
    hf_checkpoint: str  # the policy every engine serves (its key/value heads: a tensor-parallel server's shards)


class ExternalEngines(EngineLauncher):
    """``--rollout-external-engine-addrs host:port ...``: servers the user runs; probed, never restarted."""

    name = "external"
    can_restart = False
    config_class = ExternalEnginesConfig
    cfg: ExternalEnginesConfig

    def count(self) -> int:
        return len(self.cfg.rollout_external_engine_addrs or [])

    def begin(self, indices: list[int]) -> Any:
        return indices

    def finish(self, pending: Any) -> list[EngineRecord]:
        return [self._attach(i, self.cfg.rollout_external_engine_addrs[i]) for i in pending]

    def _attach(self, index: int, address: str) -> EngineRecord:
        url = address if "://" in address else f"http://{address}"
        client = EngineClient(url, control_timeout=ATTACH_TIMEOUT_S)
        try:
            info = run_closing(client.server_info())
        except EngineError as exc:
            raise ConfigError(f"--rollout-external-engine-addrs {address}: engine unreachable ({exc})") from None
        ours = info.get("relax_engine") if isinstance(info, dict) else None
        device = ours.get("device", "unknown") if isinstance(ours, dict) else "unknown"
        tp_size = int(info.get("tp_size", 1) or 1)
        kv_heads = key_value_heads(str(self.cfg.hf_checkpoint)) if tp_size > 1 else None
        return EngineRecord(index, SyncTarget(f"engine:{index}", url, device, checksums="relax" if ours is not None else "sglang",
                                              tp_size=tp_size, host_tensors=ours is not None, kv_heads=kv_heads))


def launcher_class(kind: str) -> type[EngineLauncher]:
    """The launcher of ``kind`` (``--rollout-backend``, or ``external``)."""
    launchers = {cls.name: cls for cls in (EmbeddedLauncher, SGLangLauncher, ExternalEngines)}
    if kind not in launchers:
        raise ConfigError(f"unknown engine kind {kind!r}; one of embedded, sglang, external")
    return launchers[kind]
