"""An elastic rollout fleet: engines join and leave a running job (issue 42, first slice).

Scale-out (`FleetScaler.scale_out`): each new engine is started by the run's own launcher (the code path
that starts the first engines and fault tolerance's replacements), must answer ``/health_generate``, and
is given the last sync's own bytes (`Runtime.resync_targets`, `WeightPusher.resync`) before it joins the
router, all within ``--scale-out-timeout``. Engines that miss the deadline or fail count as failed;
``--scale-out-partial-success-policy`` then keeps the healthy ones (``keep_partial``) or removes every
new engine (``rollback_all``). The weight push and the join happen under the runtime's ``weights_lock``,
so no sync can land between them: a joiner's first weights.jsonl record is at the current version.

Scale-in (`FleetScaler.scale_in`): the router sends the leaving engines no new request; what they still
run gets ``--scale-in-drain-timeout`` to finish, then is aborted (``/abort_request``): the engine answers
those requests with the tokens so far and ``finish_reason: abort``, and the rollout puts the samples back
in the buffer (partial rollout resumes them from their tokens; the default rollout generates them again),
so none is lost. The engines then leave the router and the syncs, and each is stopped, or killed when it
does not stop within ``--scale-in-shutdown-timeout``.

Every step is an event in events.jsonl (``scale_out_start``, ``process_started``, ``engine_healthy``,
``scale_out_engine_failed``, ``scale_out_decision``, ``engine_joined``, ``scale_in_start``, ``scale_in_abort``,
``engine_left``); with the router's ``first_request_at`` per engine (``fleet_final``) they time a join
(ci/bench_join.py).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from relax.backends.embedded.hosting import is_loopback
from relax.distributed.placement import Slot, where
from relax.engine.launcher import EngineRecord
from relax.engine.rollout.engine_client import EngineClient, EngineError
from relax.utils.flag_slice import FlagSlice
from relax.utils.flag_types import ConfigError
from relax.utils.http_utils import run_closing

ABORT_SETTLE_S = 10.0
"""After an abort, how long scale-in waits for the aborted requests' answers to pass the router (bounded)."""


class PartialSuccessPolicy(StrEnum):
    ROLLBACK_ALL = "rollback_all"
    KEEP_PARTIAL = "keep_partial"


@dataclass(frozen=True)
class ElasticConfig(FlagSlice):
    """The elastic fleet's flags (a typed slice, built by the driver with ``ElasticConfig.from_args(args)``)."""

    scale_out_timeout: float
    scale_out_partial_success_policy: str
    scale_in_drain_timeout: float
    scale_in_shutdown_timeout: float
    fleet_control_addr: str | None
    fleet_control_api_key: str | None

    @property
    def policy(self) -> PartialSuccessPolicy:
        return PartialSuccessPolicy(self.scale_out_partial_success_policy)

    @property
    def keeps_snapshot(self) -> bool:
        """A joining engine is given the last sync's bytes, which the trainer keeps only when asked."""
        return self.fleet_control_addr is not None

    def validate(self) -> None:
        PartialSuccessPolicy(self.scale_out_partial_success_policy)
        if self.fleet_control_addr is not None:
            check_bind(self.fleet_control_addr, self.fleet_control_api_key)


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--fleet-control-addr {addr!r}: expected HOST:PORT (port 0: a free one)")
    return host.strip("[]"), int(port)


def check_bind(addr: str, api_key: str | None) -> None:
    host, _ = split_addr(addr)
    if not is_loopback(host) and not api_key:
        raise ConfigError(f"--fleet-control-addr {addr}: {host} is not loopback: --fleet-control-api-key is required")


class ScaleError(RuntimeError):
    """A scale request the fleet refuses (one line naming why)."""


# ---------------------------------------------------------------------------------------------- pure steps
def decide(policy: PartialSuccessPolicy, ready: list[int], failed: dict[int, str]) -> tuple[list[int], list[int]]:
    """(keep, remove) of a scale-out's new engines: ``ready`` passed every step, ``failed`` did not."""
    if not failed:
        return list(ready), []
    if policy is PartialSuccessPolicy.KEEP_PARTIAL:
        return list(ready), sorted(failed)
    return [], sorted([*ready, *failed])


def drain(urls: list[str], outstanding: Callable[[str], int], abort: Callable[[str], None], *, drain_timeout: float,
          settle_timeout: float = ABORT_SETTLE_S, poll_s: float = 0.05) -> dict[str, int]:
    """Wait up to ``drain_timeout`` for ``urls`` (already drained of new requests) to finish what they run; abort
    the rest (``abort(url)``) and wait up to ``settle_timeout`` for the aborted answers. Returns, per URL, how many
    requests were still running at the drain deadline (0: it drained)."""
    deadline = time.monotonic() + drain_timeout
    while any(outstanding(u) for u in urls) and time.monotonic() < deadline:
        time.sleep(poll_s)
    left = {u: outstanding(u) for u in urls}
    for url, count in left.items():
        if count:
            abort(url)
    settle = time.monotonic() + settle_timeout
    while any(outstanding(u) for u in urls) and time.monotonic() < settle:
        time.sleep(poll_s)
    return left


def stop_actor(actor: Any, timeout_s: float, graceful: str | None = None) -> str:
    """Stop an engine's actor: its ``graceful`` method (an SGLang server's ``stop``) and Ray's own exit, waited for
    ``timeout_s``; ``ray.kill`` past it. Returns ``stopped`` or ``killed``."""
    deadline = time.monotonic() + timeout_s
    try:
        if graceful is not None:
            ray.get(getattr(actor, graceful).remote(), timeout=timeout_s)
        ray.get(actor.__ray_terminate__.remote(), timeout=max(0.1, deadline - time.monotonic()))
    except RayActorError:
        return "stopped"  # it exited: the terminate call's answer is the actor's death
    except GetTimeoutError:
        pass
    else:
        if _gone(actor, max(0.1, deadline - time.monotonic())):
            return "stopped"
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - it may have exited meanwhile
        pass
    return "killed"


def _gone(actor: Any, timeout_s: float) -> bool:
    try:
        ray.get(actor.pid.remote(), timeout=timeout_s)
        return False
    except RayActorError:
        return True
    except GetTimeoutError:
        return False


# ---------------------------------------------------------------------------------------------- the scaler
class FleetScaler:
    """Scale operations on a running `Runtime`'s fleet, one at a time."""

    def __init__(self, rt: Any, cfg: ElasticConfig):
        self.rt, self.cfg = rt, cfg
        self._op = threading.Lock()

    @property
    def fleet(self):
        return self.rt.fleet

    def wait_idle(self) -> bool:
        """Wait (bounded by the operations' own timeouts) for a scale operation in progress to end: the run shuts
        down with its engines accounted for. False: it did not end in time."""
        bound = self.cfg.scale_out_timeout + self.cfg.scale_in_drain_timeout + 2 * self.cfg.scale_in_shutdown_timeout
        if self._op.acquire(timeout=bound):
            self._op.release()
            return True
        return False

    def live(self) -> list[dict[str, Any]]:
        return [{"index": r.index, "url": r.target.url} for r in self.fleet.live_records()]

    # ------------------------------------------------------------------ scale-out
    def scale_out(self, count: int) -> dict[str, Any]:
        if count < 1:
            raise ScaleError(f"scale-out of {count} engines: ask for at least 1")
        if not self.fleet.launcher.can_restart:
            raise ScaleError(f"scale-out: {self.fleet.launcher.name} engines are started by the user, not the run")
        if not self._op.acquire(timeout=self.cfg.scale_out_timeout):
            raise ScaleError(f"scale-out: another scale operation held the fleet for {self.cfg.scale_out_timeout} s")
        try:
            return self._scale_out(count)
        finally:
            self._op.release()

    def _scale_out(self, count: int) -> dict[str, Any]:
        rt, fleet, timeout = self.rt, self.fleet, self.cfg.scale_out_timeout
        deadline = time.monotonic() + timeout
        indices = fleet.new_indices(count)
        hosts = [r for r in fleet.live_records() if r.actor is not None]  # engines whose GPU a joiner may share
        for n, i in enumerate(indices):
            host = hosts[n % len(hosts)] if hosts else None
            template = fleet.launcher.slots[host.index if host is not None else 0]
            fleet.launcher.slots.append(_joiner_slot(template, i, _visible_gpus(template, host)))
        rt.artifacts.event("scale_out_start", count=count, engines=[f"engine:{i}" for i in indices],
                           timeout_s=timeout, policy=self.cfg.policy.value)
        started, failed = self._start(indices, deadline)
        if not rt.weights_lock.acquire(timeout=max(0.1, deadline - time.monotonic())):
            for i in started:
                failed[i] = "the weights lock stayed held (a sync in progress) past --scale-out-timeout"
            keep, remove = self._decide(started, failed)
        else:  # held from the weight push to the join: no sync lands between them
            try:
                self._sync(started, failed, deadline)
                keep, remove = self._decide(started, failed)
                for i in keep:
                    fleet.join(started[i])
                    rt.artifacts.event("engine_joined", role=f"engine:{i}", url=started[i].target.url,
                                       version=rt.version)
            finally:
                rt.weights_lock.release()
        for i in remove:  # never behind the router: nothing to drain
            if i in started and started[i].actor is not None:
                stop_actor(started[i].actor, self.cfg.scale_in_shutdown_timeout, fleet.launcher.graceful_stop)
        return {"joined": keep, "removed": remove, "failed": {str(i): r for i, r in failed.items()},
                "engines": self.live()}

    def _decide(self, started: dict[int, EngineRecord], failed: dict[int, str]) -> tuple[list[int], list[int]]:
        keep, remove = decide(self.cfg.policy, sorted(i for i in started if i not in failed), failed)
        self.rt.artifacts.event("scale_out_decision", policy=self.cfg.policy.value,
                                kept=[f"engine:{i}" for i in keep], removed=[f"engine:{i}" for i in remove],
                                failed={f"engine:{i}": r for i, r in failed.items()})
        return keep, remove

    def _start(self, indices: list[int], deadline: float) -> tuple[dict[int, EngineRecord], dict[int, str]]:
        """Start each engine and wait for its ``/health_generate``, in parallel, until ``deadline``."""
        launcher = self.fleet.launcher
        pending = {i: launcher.begin([i]) for i in indices}

        def bring_up(i: int) -> EngineRecord:
            record = launcher.finish(pending[i])[0]
            self.rt.artifacts.event("process_started", role=f"engine:{i}", url=record.target.url,
                                    **{**(where(record.actor) if record.actor is not None else {}), "pid": record.pid})
            _wait_generating(record, deadline)
            self.rt.artifacts.event("engine_healthy", role=f"engine:{i}", url=record.target.url)
            return record

        started: dict[int, EngineRecord] = {}
        failed: dict[int, str] = {}
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(indices), thread_name_prefix="relax-scale-out")
        futures = {pool.submit(bring_up, i): i for i in indices}
        done, _ = concurrent.futures.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
        for future, i in futures.items():
            if future in done and future.exception() is None:
                started[i] = future.result()
                continue
            reason = (f"not up within --scale-out-timeout {self.cfg.scale_out_timeout:g} s" if future not in done
                      else _one_line(future.exception()))
            failed[i] = reason
            launcher.abandon(pending[i])  # a start still waiting ends with its actor
            self.rt.artifacts.event("scale_out_engine_failed", role=f"engine:{i}", phase="start", reason=reason)
        pool.shutdown(wait=False, cancel_futures=True)
        return started, failed

    def _sync(self, started: dict[int, EngineRecord], failed: dict[int, str], deadline: float) -> None:
        """Give the started engines the current weights (the caller holds the weights lock); an engine that does not
        take them goes into ``failed``."""
        if not started:
            return
        try:
            self.rt.resync_targets([started[i].target for i in sorted(started)],
                                   timeout_s=max(0.1, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - every engine of this push failed to sync; the policy decides
            reason = f"weight sync failed: {_one_line(exc)}"
            for i in started:
                failed[i] = reason
                self.rt.artifacts.event("scale_out_engine_failed", role=f"engine:{i}", phase="sync", reason=reason)

    # ------------------------------------------------------------------ scale-in
    def scale_in(self, indices: list[int]) -> dict[str, Any]:
        live = {r.index: r for r in self.fleet.live_records()}
        unknown = [i for i in indices if i not in live]
        if unknown:
            raise ScaleError(f"scale-in: engine:{unknown[0]} is not in the fleet (live: "
                             f"{', '.join(f'engine:{i}' for i in sorted(live)) or 'none'})")
        if len(set(indices)) >= len(live):
            raise ScaleError(f"scale-in of {len(set(indices))} of {len(live)} engines would leave none")
        if not self._op.acquire(timeout=self.cfg.scale_in_drain_timeout + self.cfg.scale_in_shutdown_timeout):
            raise ScaleError("scale-in: another scale operation held the fleet")
        try:
            return self._scale_in(sorted(set(indices)))
        finally:
            self._op.release()

    def _scale_in(self, indices: list[int]) -> dict[str, Any]:
        rt, fleet, router = self.rt, self.fleet, self.fleet.router
        records = {i: fleet.records[i] for i in indices}
        urls = {records[i].target.url: i for i in indices}
        rt.artifacts.event("scale_in_start", engines=[f"engine:{i}" for i in indices],
                           drain_timeout_s=self.cfg.scale_in_drain_timeout)
        for url in urls:
            router.drain_worker(url)

        def abort(url: str) -> None:
            i = urls[url]
            rt.artifacts.event("scale_in_abort", role=f"engine:{i}", in_flight=router.outstanding(url))
            try:
                run_closing(fleet.client(i, control_timeout=5.0).abort_request(abort_all=True))
            except EngineError as exc:  # it is leaving anyway; its requests fail over or are retried
                rt.artifacts.event("scale_in_abort", role=f"engine:{i}", error=_one_line(exc))

        left = drain(list(urls), router.outstanding, abort, drain_timeout=self.cfg.scale_in_drain_timeout)
        with rt.weights_lock:
            for i in indices:
                fleet.drop(i)  # out of the router and of every later sync
        result = {}
        for i in indices:
            actor = records[i].actor
            how = stop_actor(actor, self.cfg.scale_in_shutdown_timeout, fleet.launcher.graceful_stop) if actor else "detached"
            result[i] = how
            rt.artifacts.event("engine_left", role=f"engine:{i}", version=rt.version, stop=how,
                               aborted=left[records[i].target.url])
        return {"left": indices, "aborted": {str(urls[u]): n for u, n in left.items()},
                "stopped": {str(i): how for i, how in result.items()}, "engines": self.live()}


def _wait_generating(record: EngineRecord, deadline: float) -> None:
    """Poll the engine's ``/health_generate`` until it answers 200 or ``deadline`` passes (then EngineError)."""
    client = EngineClient(record.target.url, api_key=record.target.api_key)
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            run_closing(client.health_generate(timeout=max(0.1, min(30.0, deadline - time.monotonic()))))
            return
        except EngineError as exc:
            last = _one_line(exc)
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    raise EngineError(record.target.url, f"/health_generate never answered 200 before the deadline ({last})")


def _joiner_slot(template: Slot, index: int, gpu_ids: list[str]) -> Slot:
    """A placement slot for a joining engine, made from a running engine's (``template``).

    On CPU the engine's options (no placement group) fit any engine. A GPU engine shares the GPU(s) of that
    running engine (``gpu_ids``), as engines sharing one GPU do: the run's placement groups hold no spare GPU
    for it, so it takes no Ray GPU share (``num_gpus`` 0, which Ray leaves CUDA_VISIBLE_DEVICES alone for),
    goes to the same bundle's node, and sees those GPUs through CUDA_VISIBLE_DEVICES. Joiners are spread over
    the running engines in turn (`FleetScaler._scale_out`)."""
    if not template.gpus and "scheduling_strategy" not in template.options:
        return Slot(f"engine:{index}", 0, dict(template.options), None)
    if len(gpu_ids) != template.gpus:
        raise ScaleError(f"scale-out: the engine whose GPU engine:{index} would share shows GPUs {gpu_ids or 'none'}, "
                         f"not the {template.gpus} its slot computes on")
    runtime_env = dict(template.options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)}
    options = {**template.options, "num_gpus": 0, "runtime_env": runtime_env}
    return Slot(f"engine:{index}", template.gpus, options, template.node_id)


def _visible_gpus(slot: Slot, record: EngineRecord | None) -> list[str]:
    """The GPU ids an engine computes on: a joiner's own CUDA_VISIBLE_DEVICES, else what Ray gave the actor."""
    if not slot.gpus or record is None:
        return []
    own = (slot.options.get("runtime_env") or {}).get("env_vars", {}).get("CUDA_VISIBLE_DEVICES")
    return own.split(",") if own else where(record.actor)["gpu_ids"]


def _one_line(exc: BaseException | None) -> str:
    text = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300] if exc is not None else "unknown"
