"""What a run shows about itself: ``relax report`` (one HTML page), ``--timeline-dump-dir`` (a Chrome trace, a row
per actor) and ``--use-pytorch-profiler`` (torch.profiler traces of the chosen steps), from one short real run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, assert_ok, run_relax

PANELS = {"reward", "loss", "response_length", "step_time", "weight_sync", "logprob_mismatch", "staleness", "events"}
FIGURE = re.compile(r"<script type=application/json data-panel=(\w+)>(.*?)</script>", re.S)

REPO = Path(__file__).resolve().parents[1]  # the run's --custom-rm-path is a function of this module


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A 4-step quickstart run that checkpoints at steps 1 and 3, dumps its timeline and profiles steps 2 and 3."""
    tmp = tmp_path_factory.mktemp("observed")
    out = tmp / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "4", "--output-dir", str(out), "--save", str(tmp / "ckpt"),
                      "--save-interval", "2", "--timeline-dump-dir", str(out / "timeline"),
                      "--use-pytorch-profiler", "--profile-step-start", "2", "--profile-step-end", "3",
                      "--profile-target", "train_overall", "train_actor", "train_log_probs",
                      "--custom-rm-path", "tests.test_run_report.category_reward", "--reward-key", "score",
                      "--log-correct-samples", "--log-multi-turn", "--log-reward-category", "verdict"], tmp,
                     env={"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    assert_ok(proc)
    return out


async def category_reward(args, sample, **kwargs) -> dict:
    """The quickstart's exact-match reward as a dict with a category (for --log-reward-category verdict)."""
    right = sample.response.strip() == str(sample.label).strip()
    return {"score": float(right), "verdict": "right" if right else "wrong"}


def report(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relax.cli", "report", *argv], capture_output=True, text=True,
                          timeout=120)


def figures(page: str) -> dict[str, dict]:
    return {pid: json.loads(data.replace("<\\/", "</")) for pid, data in FIGURE.findall(page)}


def missing_notes(page: str) -> dict[str, str]:
    return dict(re.findall(r"<p class=missing id=missing-(\w+)>(.*?)</p>", page))


@pytest.mark.ray
@pytest.mark.slow
def test_report_plots_every_panel_the_run_has(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "page" / "report.html"
    proc = report(str(run_dir), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    figs = figures(page)
    # a colocate run has every panel's data but staleness, which says why in one line
    assert set(figs) == PANELS - {"staleness"}
    assert "not a --fully-async run" in missing_notes(page)["staleness"]
    for pid, fig in figs.items():
        assert fig["data"], pid
        for trace in fig["data"]:
            assert len(trace.get("x") or trace.get("y") or []) > 0, (pid, trace.get("name"))
    names = {pid: {t.get("name") for t in fig["data"]} for pid, fig in figs.items()}
    assert {"reward mean", "±1 std"} <= names["reward"]
    assert {"train/loss", "train/grad_norm", "train/entropy", "train/ppo_kl"} <= names["loss"]
    assert {"rollout", "train", "weight sync", "other"} <= names["step_time"]
    assert {"phase rollout", "phase train", "phase checkpoint", "weights_synced", "engine_release"} <= names["events"]
    stacked = [t for t in figs["step_time"]["data"] if t.get("stackgroup")]
    assert len(stacked) >= 4 and all(len(t["x"]) == 4 for t in stacked)
    assert len(next(t for t in figs["weight_sync"]["data"] if t["name"] == "total s/GB")["y"]) == 5  # v0..v4
    # self-contained: plotly.js inline, no external script; the status and config tables are there
    assert "<script src" not in page and "Plotly.newPlot" in page and len(page) > 2_000_000
    assert "<th>status</th><td>completed</td>" in page
    assert "<th>--num-rollout</th><td>4</td>" in page


@pytest.mark.ray
@pytest.mark.slow
def test_report_defaults_into_the_run_dir_and_plots_staleness_of_fully_async_runs(run_dir: Path,
                                                                                  tmp_path: Path) -> None:
    copy = tmp_path / "async_run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("traces", "timeline"))
    info = json.loads((copy / "run.json").read_text())
    info["config"]["fully_async"] = True
    (copy / "run.json").write_text(json.dumps(info))
    proc = report(str(copy))
    assert proc.returncode == 0, proc.stderr
    figs = figures((copy / "report.html").read_text())
    assert {t["name"] for t in figs["staleness"]["data"]} == {"mean", "max"}
    # the producer's rollout overlaps training: a line beside the stacked phases, not one of them
    rollout = next(t for t in figs["step_time"]["data"] if t["name"].startswith("rollout"))
    assert not rollout.get("stackgroup")


def test_report_of_a_run_without_metrics_says_so_per_panel(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"status": "failed", "exit_code": 2, "error": "bad flag",
                                                   "config": {"num_rollout": 3}}))
    proc = report(str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "report.html").read_text()
    assert figures(page) == {}
    notes = missing_notes(page)
    assert set(notes) == PANELS
    assert all("\n" not in note and note for note in notes.values())
    assert "<th>error</th><td>bad flag</td>" in page


@pytest.mark.parametrize("make, expected", [
    (lambda d: d / "absent", "no such directory"),
    (lambda d: (d / "file").write_text("x") and d / "file", "not a directory"),
    (lambda d: d, "not a run directory"),
])
def test_report_refuses_a_bad_run_dir_in_one_line(tmp_path: Path, make, expected: str) -> None:
    proc = report(str(make(tmp_path)))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("relax report: ") and expected in proc.stderr


def test_lines_that_are_not_json_objects_are_named_not_skipped_silently(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "rollout/reward_mean": 0.5}\n{bad\n\n[1]\n'
                                            '{"step": 1, "rollout/reward_mean": 0.7}\n{"step": 2, "rollout/rew')
    (tmp_path / "events.jsonl").write_text('{"event": "run_start", "time": 1.0}\nnot json\n')
    proc = report(str(tmp_path))
    line = "skipped 4 line(s) that are not JSON objects: metrics.jsonl:2, metrics.jsonl:4, metrics.jsonl:6, events.jsonl:2"
    assert proc.returncode == 0 and proc.stderr == f"relax report: {line}\n"
    page = (tmp_path / "report.html").read_text()
    assert f"<p class=missing id=unreadable>{line}</p>" in page
    assert "2 step(s) logged" in page  # the readable ones are plotted


def test_report_unwritable_out_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "rollout/reward_mean": 0.5}\n')
    (tmp_path / "blocker").write_text("a file")
    proc = report(str(tmp_path), "--out", str(tmp_path / "blocker" / "r.html"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cannot write" in proc.stderr


def _rows_and_spans(trace: dict) -> tuple[list[str], dict[str, set[str]]]:
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    spans: dict[str, set[str]] = defaultdict(set)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["tid"] == e["pid"]
            spans[names[e["pid"]]].add(e["name"].split()[0])
    return list(names.values()), spans


@pytest.mark.ray
@pytest.mark.slow
def test_timeline_has_a_row_per_actor_and_the_run_phases(run_dir: Path) -> None:
    trace = json.loads((run_dir / "timeline" / "timeline.json").read_text())
    rows, spans = _rows_and_spans(trace)
    actors = [json.loads(line)["role"] for line in (run_dir / "events.jsonl").read_text().splitlines()
              if json.loads(line)["event"] == "process_started"]
    assert sorted(rows) == sorted(["driver", *actors, "reward"]) and len(set(rows)) == len(rows)
    assert {"step", "rollout", "train", "sync", "checkpoint"} <= spans["driver"]
    assert {"train", "log_probs", "actor_update", "offload", "onload", "sync", "checkpoint"} <= spans["trainer:0"]
    assert {"generate", "offload", "onload", "sync"} <= spans["engine:0"]
    assert spans["reward"] == {"reward"}
    steps = sorted(e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "generate")
    assert steps == [0, 1, 2, 3]


@pytest.mark.ray
@pytest.mark.slow
def test_pytorch_profiler_traces_the_chosen_steps(run_dir: Path) -> None:
    trace_dir = run_dir / "traces" / run_dir.name / "train_trace"
    files = sorted(p.name for p in trace_dir.iterdir())
    # train_overall encloses the other targets: one trace per profiled step, the inner targets labelled in it
    assert files == ["train_overall_step2_rank0.pt.trace.json", "train_overall_step3_rank0.pt.trace.json"]
    events = json.loads((trace_dir / files[0]).read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"train_actor", "train_log_probs"} <= names
    assert any(e.get("ph") == "X" and "aten::" in str(e.get("name")) for e in events)


def test_profile_target_must_be_a_known_target(tmp_path: Path) -> None:
    proc = run_relax(["--preset", "quickstart", "--profile-target", "train_everything", "--output-dir",
                      str(tmp_path / "o")], tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "--profile-target" in proc.stderr and "train_everything" in proc.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary")
def test_report_renders_in_headless_chromium_without_console_errors(run_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert report(str(run_dir), "--out", str(page)).returncode == 0
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    shot = subprocess.run([*base, "--enable-logging=stderr", "--v=0", "--window-size=1280,4000",
                           f"--screenshot={tmp_path / 'shot.png'}", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    console = [line for line in shot.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    assert (tmp_path / "shot.png").stat().st_size > 50_000
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    for pid in PANELS - {"staleness"}:  # every figure was drawn (plotly adds its svg to the div)
        assert re.search(rf'<div id="plot-{pid}"[^>]*>.*?class="main-svg"', dom, re.S), pid


@pytest.mark.ray
@pytest.mark.slow
def test_logging_flags_add_their_metrics(run_dir: Path) -> None:
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for m in steps:
        # --log-reward-category verdict: the shares of the categories cover every sample
        shares = {k: v for k, v in m.items() if k.startswith("reward_category/") and k.endswith("/frac")}
        assert shares and abs(sum(shares.values()) - 1) < 1e-9
        if "reward_category/right/reward_mean" in m:
            assert m["reward_category/right/reward_mean"] == 1.0
        right = m.get("reward_category/right/frac", 0.0) * m["rollout/num_samples"]
        assert m["rollout/correct_samples"] == pytest.approx(right)  # --log-correct-samples
        # --log-multi-turn on single-turn samples: one round, no observation tokens
        assert m["multi_turn_metric/round_number_max"] == 1.0
        assert m["raw_response_length/response_length_mean"] == m["wo_obs_response_length/response_length_mean"]
    assert any(m["rollout/correct_samples"] > 0 for m in steps)
    m = next(m for m in steps if m["rollout/correct_samples"] > 0)
    assert sum(m[f"correct_length/p{p}"] for p in (25, 50, 75, 100)) == pytest.approx(1.0)
    assert m["rollout/correct_entropy"] > 0


def test_rollout_log_metrics_of_multi_turn_and_categories() -> None:
    from relax.observability.rollout_logs import RolloutLogConfig, rollout_log_metrics
    from relax.utils.types import Sample

    samples = [Sample(response_length=8, loss_mask=[1, 1, 0, 0, 0, 1, 1, 1], rollout_log_probs=[-0.5] * 8,
                      metadata={"turns": [{}, {}]}, reward={"score": 1.0, "kind": "math"}),
               Sample(response_length=2, loss_mask=[1, 1], rollout_log_probs=[-1.5, -0.5],
                      reward={"score": 0.0, "kind": "code"}),
               Sample(response_length=3, reward={"score": 1.0, "kind": "math"})]
    cfg = RolloutLogConfig(log_correct_samples=True, log_multi_turn=True, log_reward_category="kind",
                           rollout_max_response_len=8, reward_key="score")
    m = rollout_log_metrics(cfg, samples)
    assert m["rollout/correct_samples"] == 2 and m["rollout/correct_response_len_mean"] == 5.5
    assert m["correct_length/p25"] == 0 and m["correct_length/p50"] == 0.5 and m["correct_length/p100"] == 0.5
    assert m["rollout/correct_entropy"] == 0.5
    assert m["raw_response_length/response_length_max"] == 8 and m["wo_obs_response_length/response_length_max"] == 5
    assert m["raw_response_length/response_length_clip_ratio"] == pytest.approx(1 / 3)
    assert m["multi_turn_metric/round_number_max"] == 2 and m["multi_turn_metric/round_number_min"] == 1
    assert m["reward_category/math/frac"] == pytest.approx(2 / 3) and m["reward_category/code/reward_mean"] == 0.0
    off = RolloutLogConfig(log_correct_samples=False, log_multi_turn=False, log_reward_category=None,
                           rollout_max_response_len=8, reward_key="score")
    assert rollout_log_metrics(off, samples) == {}
