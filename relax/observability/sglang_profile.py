"""``--sglang-profile`` and its companions: torch.profiler traces of the engines during chosen rollouts.

At each selected rollout step the driver POSTs SGLang's ``/start_profile`` (``ProfileReqInput``: output_dir,
num_steps, activities, profile_by_stage, with_stack, record_shapes) to every engine before the rollout, and
``/stop_profile`` after it. With ``--sglang-profile-num-steps N`` (N > 0) an engine stops by itself after N
forward steps; the stop after the rollout then ends a session that is still open (a rollout shorter than N
steps), and an engine's "not in progress" answer means it already stopped. With -1 the session covers the
whole rollout. Traces go to ``<dir>/step<N>/``, where ``<dir>`` is ``--sglang-profile-output-dir`` or
``<output-dir>/traces/<tb-experiment-name, default the output dir's name>/sglang_trace``.

Steps: ``--sglang-profile-steps`` when given; else ``--sglang-profile-step-start``..``-step-end`` (inclusive;
either end open when unset); else every step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax.observability.config import traces_dir
from relax.utils.flag_slice import FlagSlice


@dataclass(frozen=True)
class SglangProfileConfig(FlagSlice):
    sglang_profile: bool
    sglang_profile_steps: list[int] | None
    sglang_profile_step_start: int | None
    sglang_profile_step_end: int | None
    sglang_profile_output_dir: str | None
    sglang_profile_num_steps: int
    sglang_profile_activities: list[str]
    sglang_profile_by_stage: bool
    sglang_profile_with_stack: bool
    sglang_profile_record_shapes: bool
    output_dir: str
    tb_experiment_name: str | None

    def validate(self) -> None:
        n = self.sglang_profile_num_steps
        if n != -1 and n < 1:
            raise ValueError(f"--sglang-profile-num-steps must be -1 (the whole rollout) or at least 1, got {n}")

    def profiles(self, step: int) -> bool:
        if not self.sglang_profile:
            return False
        if self.sglang_profile_steps:
            return step in self.sglang_profile_steps
        start, end = self.sglang_profile_step_start, self.sglang_profile_step_end
        return (start is None or step >= start) and (end is None or step <= end)

    @property
    def trace_root(self) -> Path:
        if self.sglang_profile_output_dir:
            return Path(self.sglang_profile_output_dir)
        return traces_dir(self.output_dir, self.tb_experiment_name, "sglang_trace")

    def request(self, step: int) -> dict[str, Any]:
        """The ``/start_profile`` body of ``step`` (SGLang's ProfileReqInput names)."""
        return {"output_dir": str((self.trace_root / f"step{step}").resolve()),
                "num_steps": None if self.sglang_profile_num_steps == -1 else self.sglang_profile_num_steps,
                "activities": list(self.sglang_profile_activities), "profile_by_stage": self.sglang_profile_by_stage,
                "with_stack": self.sglang_profile_with_stack, "record_shapes": self.sglang_profile_record_shapes}


class EngineProfiling:
    """Starts and stops the engines' profilers around the selected rollouts; ``engines`` lists the live ones
    as ``(url, api_key)``."""

    def __init__(self, cfg: SglangProfileConfig, engines: Callable[[], list[tuple[str, str | None]]]):
        self.cfg = cfg
        self.engines = engines

    @contextlib.contextmanager
    def rollout(self, step: int) -> Iterator[None]:
        if not self.cfg.profiles(step) or not self.engines():
            yield
            return
        engines = self.engines()
        body = self.cfg.request(step)
        Path(body["output_dir"]).mkdir(parents=True, exist_ok=True)
        _run(engines, lambda c: c.start_profile(body))
        try:
            yield
        finally:
            _run(engines, _stop)


async def _stop(client: Any) -> None:
    from relax.utils.http_utils import EngineHTTPError

    try:
        await client.stop_profile()
    except EngineHTTPError as exc:
        if "not in progress" not in exc.server_message:  # else: it stopped by itself after num_steps
            raise


def _run(engines: list[tuple[str, str | None]], call: Callable[[Any], Any]) -> None:
    from relax.engine.rollout.engine_client import EngineClient
    from relax.utils.http_utils import run_closing

    async def each() -> None:
        await asyncio.gather(*(call(EngineClient(url, api_key=key)) for url, key in engines))

    run_closing(each())
