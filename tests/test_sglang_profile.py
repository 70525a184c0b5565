"""--sglang-profile and its companions: the driver starts and stops the engines' profilers around the selected
rollouts (SGLang's /start_profile, /stop_profile), and the embedded engine writes torch.profiler Chrome traces."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from relax.observability.sglang_profile import SglangProfileConfig
from tests.e2e_helpers import FAST_FLAGS, run_relax


def _cfg(**kw) -> SglangProfileConfig:
    base = dict(sglang_profile=True, sglang_profile_steps=None, sglang_profile_step_start=None,
                sglang_profile_step_end=None, sglang_profile_output_dir=None, sglang_profile_num_steps=3,
                sglang_profile_activities=["CPU", "GPU"], sglang_profile_by_stage=False,
                sglang_profile_with_stack=False, sglang_profile_record_shapes=True, output_dir="/r/run",
                tb_experiment_name=None)
    return SglangProfileConfig(**{**base, **kw})


def test_steps_and_request_body() -> None:
    assert [s for s in range(6) if _cfg(sglang_profile_steps=[1, 4]).profiles(s)] == [1, 4]
    assert [s for s in range(6) if _cfg(sglang_profile_step_start=2, sglang_profile_step_end=3).profiles(s)] == [2, 3]
    assert [s for s in range(3) if _cfg().profiles(s)] == [0, 1, 2]
    assert not _cfg(sglang_profile=False).profiles(0)
    body = _cfg(tb_experiment_name="exp").request(2)
    assert body == {"output_dir": "/r/run/traces/exp/sglang_trace/step2", "num_steps": 3, "activities": ["CPU", "GPU"],
                    "profile_by_stage": False, "with_stack": False, "record_shapes": True}
    assert _cfg(sglang_profile_num_steps=-1, sglang_profile_output_dir="/t").request(0)["output_dir"] == "/t/step0"
    assert _cfg(sglang_profile_num_steps=-1).request(0)["num_steps"] is None


def _events(trace: Path) -> list[dict]:
    return json.loads(trace.read_text())["traceEvents"]


def test_the_embedded_engine_profiles_its_forward_steps(tmp_path: Path) -> None:
    """num_steps stops by itself; without it /stop_profile ends the session; refusals are one line."""
    import torch

    from relax.backends.embedded.profiling import StepProfiler

    prof = StepProfiler(torch.device("cpu"))

    def serve_and_step(n: int) -> None:
        prof.serve()
        for _ in range(n):
            torch.randn(8, 8) @ torch.randn(8, 8)
            prof.after_step()

    fut = prof.request("start", {"output_dir": str(tmp_path / "a"), "num_steps": 2, "record_shapes": True})
    serve_and_step(3)
    assert fut.result(0).startswith("Start profiling") and not prof.active
    (trace,) = (tmp_path / "a").glob("*.trace.json")
    assert any(e.get("name") == "aten::mm" for e in _events(trace))
    stop = prof.request("stop")
    prof.serve()
    with pytest.raises(RuntimeError, match="not in progress"):
        stop.result(0)
    prof.request("start", {"output_dir": str(tmp_path / "b"), "activities": ["CPU"]})
    serve_and_step(1)
    stop = prof.request("stop")
    prof.serve()
    assert "1 forward steps" in stop.result(0) and len(list((tmp_path / "b").glob("*.trace.json"))) == 1
    refused = prof.request("start", {"activities": ["RPD"]})
    prof.serve()
    with pytest.raises(ValueError, match="activities RPD are not implemented"):
        refused.result(0)
    assert not prof.active


@pytest.mark.ray
def test_a_run_leaves_a_trace_only_for_the_selected_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    start = time.time()
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--sglang-profile", "--sglang-profile-steps", "1",
                      "--tb-experiment-name", "exp", "--output-dir", str(run)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = run / "traces" / "exp" / "sglang_trace"
    assert sorted(p.name for p in root.iterdir()) == ["step1"]
    traces = list((root / "step1").glob("*.trace.json"))
    assert len(traces) >= 1, list((root / "step1").iterdir())
    events = _events(traces[0])
    assert any(e.get("ph") == "X" and e.get("name", "").startswith("aten::") for e in events)
    assert traces[0].stat().st_mtime >= start


def test_the_engine_server_serves_start_and_stop_profile(tmp_path: Path) -> None:
    """Over HTTP, as the driver calls it: a session without num_steps spans requests until /stop_profile (served
    while the engine is idle); a field this engine does not implement is a 400 naming it."""
    from relax.backends.embedded.launch import EngineProcess
    from relax.engine.rollout.engine_client import EngineClient
    from relax.utils.http_utils import EngineHTTPError, run_closing

    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--seed", "1"])
    try:
        client = EngineClient(proc.url, timeout=60)
        gen = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}

        async def session() -> tuple[str, str]:
            started = await client.start_profile({"output_dir": str(tmp_path / "t"), "activities": ["CPU", "GPU"],
                                                  "record_shapes": True, "with_stack": False})
            await client.generate([gen, gen])
            return started, await client.stop_profile()

        started, stopped = run_closing(session())
        assert started.startswith("Start profiling") and "forward steps" in stopped
        (trace,) = (tmp_path / "t").glob("*.trace.json")
        assert any(e.get("name", "").startswith("aten::") for e in _events(trace))
        with pytest.raises(EngineHTTPError, match="not in progress"):
            run_closing(client.stop_profile())
        with pytest.raises(EngineHTTPError, match="profile_by_stage"):
            run_closing(client.start_profile({"profile_by_stage": True}))
    finally:
        proc.stop()
