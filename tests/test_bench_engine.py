"""CPU checks of ci/bench_engine.py: the roofline arithmetic (against issue 19's ~80,000 tok/s at 40% on the
H100), the device bandwidth table, the runner order, and a smoke run with a fresh process per measurement
that prints the table and writes JSON with provenance. The GPU run is the same code with bench-270m."""

from __future__ import annotations

import json

import pytest

from ci import bench_engine as be
from relax.models import build_config


def test_roofline_counts_weights_and_kv_cache_and_matches_the_issues_figure() -> None:
    cfg = build_config("bench-270m")
    weights = 266_898_432 * 2  # bench-270m's parameters in bf16
    kv_per_token = 2 * 16 * 8 * 64 * 2  # K and V, 16 layers, 8 KV heads, head_dim 64, bf16
    step_bytes = weights + 64 * (128 + 256 / 2) * kv_per_token
    expected = 64 / (step_bytes / 3.35e12)
    got = be.decode_roofline(cfg, weights, 64, 128, 256, 3.35)
    assert got == pytest.approx(expected, rel=1e-12)
    assert 0.40 * got == pytest.approx(80_000, rel=0.01)  # issue 19: "about 80,000 tok/s"
    # batch 256: the KV cache (2.1 GB) outweighs the weights, so the roofline grows 1.6x, not 4x
    at_256 = be.decode_roofline(cfg, weights, 256, 128, 256, 3.35)
    assert at_256 == pytest.approx(256 / ((weights + 256 * 256 * kv_per_token) / 3.35e12), rel=1e-12)
    assert 1.5 * got < at_256 < 1.7 * got


def test_bandwidth_comes_from_the_devices_spec() -> None:
    assert be.hbm_tbps("NVIDIA H100 80GB HBM3") == 3.35
    assert be.hbm_tbps("NVIDIA H200") == 4.8
    assert be.hbm_tbps("NVIDIA A10G") is None


def test_runner_order_is_given_reversed_or_a_seeded_shuffle() -> None:
    names = list(be.RUNNERS)
    assert be.ordered(names, "given", 0) == names and be.ordered(names, "reversed", 0) == names[::-1]
    shuffled = be.ordered(names, "shuffled", 3)
    assert sorted(shuffled) == sorted(names) and shuffled == be.ordered(names, "shuffled", 3)
    assert any(be.ordered(names, "shuffled", s) != names for s in range(5))


@pytest.mark.parametrize("argv", [["--batches", "0"], ["--device", "cpu", "--runners", "lean+graph"],
                                  ["--hbm-tbps", "-1"], ["--runners", "vllm"], ["--repeats", "0"]])
def test_bad_arguments_exit_with_a_message(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        be.parse(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_defaults_are_the_issues_workload_with_a_batch_256_row() -> None:
    ns = be.parse([])
    assert (ns.model, ns.batches, ns.prompt, ns.new, ns.device) == ("bench-270m", [64, 256], 128, 256, "cuda")
    assert ns.runners == be.DEFAULT_RUNNERS and not ns.in_process and ns.repeats == 5


SMOKE = ["--device", "cpu", "--model", "tiny-qwen3", "--batches", "4", "--prompt", "8", "--new", "6",
         "--runners", "lean", "hf", "--hbm-tbps", "0.05"]


def test_cpu_smoke_measures_each_runner_in_its_own_process_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "engine.json"
    assert be.main([*SMOKE, "--order", "reversed", "--repeats", "3", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "a fresh process each" in stdout and "runners in reversed order" in stdout
    data = json.loads(out.read_text())
    assert [r["runner"] for r in data["rows"]] == ["HF generate", "hf", "lean"]
    assert all(r["tokens_per_s"] > 0 and not r["error"] for r in data["rows"])
    engine_rows = data["rows"][1:]
    assert all(0 <= r["mismatch_mean"] <= r["mismatch_max"] < 1e-4 for r in engine_rows)  # fp32 on both sides
    for r in engine_rows:  # --repeats 3: the figure is over the median of three timed generates, in the note
        walls = sorted(r["walls_s"])
        assert len(walls) == 3 and r["tokens_per_s"] == pytest.approx(4 * 6 / walls[1], rel=1e-12)
        assert len(r["full_gc_s"]) == 3 and all(0 <= s < w for s, w in zip(r["full_gc_s"], r["walls_s"], strict=True))
    assert stdout.count("median of 3 (") == 2
    assert data["hbm_source"] == "--hbm-tbps" and data["roofline_tok_s"]["4"] > 0
    assert data["provenance"]["command"] and data["provenance"]["commit"] and data["complete"] is True


def test_a_measurement_that_fails_is_a_row_with_its_error(tmp_path, capsys) -> None:
    assert be.main([*SMOKE, "--runners", "lean", "--timeout", "0.01"]) == 1
    assert "no result within 0.01 s (--timeout)" in capsys.readouterr().out
    row = be.measure_safely(be.parse(SMOKE), "lean", 0)  # zero rows: the engine refuses, the bench goes on
    assert row.error and row.tokens_per_s is None


def test_profile_rows_say_where_the_time_goes(tmp_path, capsys) -> None:
    out = tmp_path / "engine.json"
    assert be.main([*SMOKE, "--runners", "lean", "--in-process", "--profile", "--json", str(out)]) == 0
    assert "profile of lean at batch 4: top-level CPU operators:" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["profile"] is None  # HF generate is timed only
    prof = rows[1]["profile"]
    assert prof["kernels"] > 0 and 0 < prof["busy_s"] <= prof["wall_s"] and prof["top"]
    assert sum(k["share"] for k in prof["top"]) <= 1 + 1e-9
    assert prof["busy_share_of_timed_run"] == pytest.approx(prof["busy_s"] / prof["timed_wall_s"])
    assert prof["timed_wall_s"] == pytest.approx(4 * 6 / rows[1]["tokens_per_s"])


def test_an_in_process_measurement_freezes_after_its_warm_ups_and_thaws_after() -> None:
    """What the warm-ups leave is frozen for the timed generates (as `relax train` freezes after its first steps),
    and thawed when the measurement ends, so the next runner's collections reach this engine again."""
    import gc

    frozen = []
    real = be.freeze_startup_objects
    gc.unfreeze()
    try:
        be.freeze_startup_objects = lambda: frozen.append(real()) or frozen[-1]
        row = be.measure(be.parse([*SMOKE, "--runners", "lean", "--repeats", "2"]), "lean", 4)
    finally:
        be.freeze_startup_objects = real
    assert len(frozen) == 1 and frozen[0] > 0 and len(row.full_gc_s) == 2
    assert gc.get_freeze_count() == 0


def test_a_run_cut_short_keeps_the_rows_it_measured(tmp_path, monkeypatch) -> None:
    out = tmp_path / "engine.json"
    calls = []

    def fake(ns, runner, batch):
        if calls:
            raise KeyboardInterrupt  # the device call's time limit, as the second measurement starts
        calls.append(runner)
        return be.Row(runner, batch, tokens_per_s=123.0)

    monkeypatch.setattr(be, "measure_in_subprocess", fake)
    with pytest.raises(KeyboardInterrupt):
        be.main([*SMOKE, "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["complete"] is False and [(r["runner"], r["tokens_per_s"]) for r in data["rows"]] == [
        ("HF generate", 123.0)]


def test_engine_paths_bench_times_each_layer_of_the_rollout_path_on_cpu(tmp_path, capsys) -> None:
    """ci/bench_engine_paths.py: the same batch through steps, generate, the scheduler thread and HTTP (also
    after a release + resume + weight update); each path's seconds, its ratio to the decode alone and the
    engine's own e2e_latency, which the HTTP paths' wall time contains."""
    from ci import bench_engine_paths as bep

    out = tmp_path / "paths.json"
    assert bep.main(["--device", "cpu", "--model", "tiny-qwen3", "--batch", "3", "--prompt", "6", "--new", "5",
                     "--repeats", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    paths = data["paths"]
    assert list(paths) == ["steps", "generate", "scheduler", "http", "http_after_release"]
    assert paths["steps"]["vs_steps"] == 1.0 and paths["steps"]["respond_s"] > 0
    for name in ("http", "http_after_release"):
        assert 0 < paths[name]["e2e_latency"] < paths[name]["seconds"]
    assert data["provenance"]["command"] and "| http_after_release |" in capsys.readouterr().out


def test_full_collections_counts_only_generation_two() -> None:
    import gc

    with be.FullCollections() as young:
        gc.collect(0)
        gc.collect(1)
    assert young.seconds == 0.0
    with be.FullCollections() as full:
        gc.collect()
    assert full.seconds > 0.0
    assert full._callback not in gc.callbacks  # removed on exit
