"""CPU checks of ci/bench_engine.py's ``sglang`` runner (ci/bench_sglang.py): its arguments, the server command
relax's launcher builds for it, the requests (the embedded rows' own, with ``ignore_eos``) and how they are sent,
the ratio embedded / SGLang, and the whole measuring path against a stand-in server (tests/fake_sglang_server.py):
rows, timing, mismatch, and the server ended on success, on an early exit, on a start that never becomes ready
and on short answers. Real SGLang on a GPU: the last test (markers gpu and sglang), skipped here with its reason."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from ci import bench_engine as be
from ci import bench_sglang as bs

FAKE = Path(__file__).with_name("fake_sglang_server.py")
ISSUE = ["--runners", "lean+graph+compile", "sglang", "--batches", "64", "256"]


def test_the_issues_command_parses_and_the_sglang_runner_is_not_a_default() -> None:
    ns = be.parse(ISSUE)
    assert ns.runners == ["lean+graph+compile", "sglang"] and ns.batches == [64, 256]
    assert (ns.sglang_attention_backend, ns.sglang_requests, ns.sglang_mem_fraction_static) == ("triton", "batched", 0.3)
    assert bs.SGLANG not in be.DEFAULT_RUNNERS and bs.SGLANG not in be.RUNNERS


@pytest.mark.parametrize("argv", [["--device", "cpu", "--runners", "sglang"],
                                  [*ISSUE, "--sglang-attention-backend", "fa3"],
                                  [*ISSUE, "--sglang-mem-fraction-static", "1.5"],
                                  [*ISSUE, "--sglang-startup-timeout", "0"], [*ISSUE, "--sglang-requests", "stream"]])
def test_bad_sglang_arguments_exit_with_a_message(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        be.parse(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_the_server_command_is_relax_launchers_with_graphs_up_to_the_largest_batch() -> None:
    ns = be.parse(ISSUE)
    cmd = bs.server_command(ns, "/tmp/m/bench-270m", 31000, 31001)
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    text = " ".join(cmd)
    for part in ("--model-path /tmp/m/bench-270m", "--port 31000", "--nccl-port 31001", "--dtype bfloat16",
                 "--random-seed 0", "--tp-size 1", "--mem-fraction-static 0.3", "--attention-backend triton",
                 "--sampling-backend pytorch", "--grammar-backend none", "--disable-prefill-cuda-graph",
                 "--cuda-graph-max-bs-decode 256", "--max-running-requests 256", "--context-length 392"):
        assert part in text, part
    assert "fa3" not in text and "--disable-cuda-graph " not in text + " " and "--disable-decode-cuda-graph" not in text
    assert "--enable-memory-saver" not in text  # nothing to release between rows


def test_requests_are_the_embedded_rows_own_plus_ignore_eos() -> None:
    prompts = torch.arange(12).reshape(3, 4)
    embedded = be.engine_requests(prompts, 5, 0)
    ours = bs.sglang_requests(embedded)
    assert [r["input_ids"] for r in ours] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(r["return_logprob"] for r in ours)
    assert [r["sampling_params"] for r in ours] == [
        {"temperature": 1.0, "max_new_tokens": 5, "sampling_seed": i, "ignore_eos": True} for i in range(3)]
    assert all("ignore_eos" not in r["sampling_params"] for r in embedded)  # the embedded rows' stay as they were


class RecordingClient:
    def __init__(self) -> None:
        self.posts: list = []

    async def generate(self, request):
        if isinstance(request, list):
            return list(await asyncio.gather(*(self.generate(r) for r in request)))
        self.posts.append(request)
        n = len(request["input_ids"]) if isinstance(request["input_ids"][0], list) else 0
        return [{"output_ids": [1]}] * n if n else {"output_ids": [1]}


def test_batched_mode_is_one_generate_as_the_rollouts_pool_sends_it_and_concurrent_is_one_per_row() -> None:
    reqs = bs.sglang_requests(be.engine_requests(torch.ones(4, 3, dtype=torch.long), 2, 0))
    client = RecordingClient()
    assert len(asyncio.run(bs.send(client, reqs, "batched"))) == 4
    (post,) = client.posts
    assert post["input_ids"] == [[1, 1, 1]] * 4 and [p["sampling_seed"] for p in post["sampling_params"]] == [0, 1, 2, 3]
    client = RecordingClient()
    assert len(asyncio.run(bs.send(client, reqs, "concurrent"))) == 4 and client.posts == reqs


def test_ratio_is_each_runners_tok_s_over_sglangs_at_the_same_batch() -> None:
    rows = [be.Row("HF generate", 64, tokens_per_s=1_000.0), be.Row("lean+graph+compile", 64, tokens_per_s=90_000.0),
            be.Row("sglang", 64, tokens_per_s=60_000.0), be.Row("lean+graph+compile", 256, tokens_per_s=150_000.0),
            be.Row("sglang", 256, error="boom"), be.Row("lean+graph", 64, error="x")]
    table = bs.ratios(rows, ("HF generate",))
    assert table == {64: {"lean+graph+compile": pytest.approx(1.5)}}  # no SGLang figure at 256: no ratio there
    assert bs.ratio_lines(table) == ["lean+graph+compile / SGLang at batch 64: 1.50x"]


# ---------------------------------------------------------------------------------------------- against a stand-in
def fake_ns(tmp_path: Path, **changes) -> argparse.Namespace:
    ns = argparse.Namespace(model="tiny-qwen3", device="cpu", batches=[3, 2], prompt=4, new=5, repeats=2, timeout=30.0,
                            sglang_attention_backend="triton", sglang_mem_fraction_static=0.3, sglang_requests="batched",
                            sglang_startup_timeout=30.0, sglang_model_dir=str(tmp_path / "model"),
                            sglang_log=str(tmp_path / "server.log"), runners=["sglang"])
    vars(ns).update(changes)
    return ns


def fake_command(mode: str, pid_file: Path, ns, model_dir: str, port: int, nccl_port: int) -> list[str]:
    assert (Path(model_dir) / "config.json").is_file() and (Path(model_dir) / "model.safetensors").is_file()
    return [sys.executable, str(FAKE), "--port", str(port), "--mode", mode, "--pid-file", str(pid_file)]


def ended(pid_file: Path, within: float = 10.0) -> bool:
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def measure(ns, mode: str, pid_file: Path) -> list[be.Row]:
    return bs.measure_rows(ns, be.Row, be.workload, be.mismatch, command=partial(fake_command, mode, pid_file),
                           log=lambda _m: None)


def test_rows_from_one_server_for_every_batch_then_the_server_is_ended(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    rows = measure(fake_ns(tmp_path), "ok", pid_file)
    assert [(r.runner, r.batch, r.error) for r in rows] == [("sglang", 3, ""), ("sglang", 2, "")]
    for r in rows:
        assert len(r.walls_s) == 2 and r.tokens_per_s == pytest.approx(r.batch * 5 / statistics.median(r.walls_s))
        assert r.server_s == [0.001, 0.001]
        assert r.mismatch_max >= r.mismatch_mean > 0  # the stand-in's log-probs are not the model's
    assert ended(pid_file)
    # the weights the server loads are the embedded rows' (seed 0), bit for bit
    from relax.models import build_model

    saved = build_model(str(tmp_path / "model" / "tiny-qwen3"))
    model, _ = be.workload(fake_ns(tmp_path), 2)
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), model.state_dict().values(), strict=True))


def test_the_same_prompts_reach_sglang_as_the_embedded_rows(tmp_path: Path) -> None:
    ns = fake_ns(tmp_path)
    model, prompts = be.workload(ns, 3)
    again, same = be.workload(ns, 3, model=model)
    assert again is model and torch.equal(prompts, same)


@pytest.mark.parametrize(("mode", "error"), [
    ("exit", "RuntimeError: SGLang server exited with 3 before serving: fake sglang: RuntimeError: no GPU here"),
    ("never-ready", "RuntimeError: SGLang server not healthy within 2 s (--sglang-startup-timeout)"),
])
def test_a_server_that_does_not_come_up_is_every_rows_one_line_error_and_is_ended(tmp_path: Path, mode: str,
                                                                                  error: str) -> None:
    pid_file = tmp_path / "pid"
    t0 = time.monotonic()
    rows = measure(fake_ns(tmp_path, sglang_startup_timeout=2.0), mode, pid_file)
    assert time.monotonic() - t0 < 30
    assert [r.batch for r in rows] == [3, 2] and all(r.error.startswith(error) and "\n" not in r.error for r in rows)
    assert all(r.tokens_per_s is None for r in rows)
    assert ended(pid_file)


def test_the_server_dies_with_a_bench_process_killed_outright(tmp_path: Path) -> None:
    """SIGKILL leaves no ``finally``: PR_SET_PDEATHSIG ends the server anyway."""
    import subprocess

    pid_file = tmp_path / "pid"
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
              "from ci.bench_sglang import Server\n"
              "from relax.backends.sglang.launcher import _free_port\n"
              "port = _free_port()\n"
              f"s = Server([sys.executable, {str(FAKE)!r}, '--port', str(port), '--pid-file', {str(pid_file)!r}], None, "
              f"{str(tmp_path / 'log')!r}, f'http://127.0.0.1:{{port}}')\n"
              "s.start(); s.wait_ready(30); print('ready', flush=True)\n"
              "import time; time.sleep(60)\n")
    bench = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout.readline().strip() == "ready"
    finally:
        bench.kill()
        bench.wait(timeout=10)
    assert ended(pid_file)


def test_short_answers_are_an_error_naming_ignore_eos(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    rows = measure(fake_ns(tmp_path, batches=[2]), "short", pid_file)
    assert rows[0].error == "RuntimeError: SGLang returned 4..4 tokens per row, not --new 5 (ignore_eos not honoured?)"
    assert ended(pid_file)


def test_without_sglang_the_rows_say_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from relax.backends.sglang import launcher

    monkeypatch.setattr(launcher, "sglang_available", lambda: False)
    rows = bs.measure_rows(fake_ns(tmp_path), be.Row, be.workload, be.mismatch, log=lambda _m: None)
    assert [r.batch for r in rows] == [3, 2] and all("needs SGLang" in r.error for r in rows)


def test_main_prints_and_writes_the_ratio_embedded_over_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys) -> None:
    """The whole bench on CPU with the stand-in: ``--device cpu`` is refused for the sglang runner, so the check
    and the server command are replaced; everything else is the GPU run's code."""
    pid_file = tmp_path / "pid"
    monkeypatch.setattr(bs, "check_arguments", lambda ns: None)
    monkeypatch.setattr(bs, "measure_rows", partial(bs.measure_rows, command=partial(fake_command, "ok", pid_file)))
    out = tmp_path / "engine.json"
    argv = ["--device", "cpu", "--model", "tiny-qwen3", "--batches", "4", "2", "--prompt", "4", "--new", "5",
            "--runners", "sglang", "lean", "--no-hf", "--in-process", "--repeats", "2", "--hbm-tbps", "0.05",
            "--sglang-model-dir", str(tmp_path / "model"), "--sglang-log", str(tmp_path / "server.log"),
            "--json", str(out)]
    assert be.main(argv) == 0
    stdout = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert [(r["runner"], r["batch"]) for r in data["rows"]] == [("lean", 4), ("sglang", 4), ("lean", 2), ("sglang", 2)]
    rows = {(r["runner"], r["batch"]): r for r in data["rows"]}
    for b in (4, 2):
        ratio = rows[("lean", b)]["tokens_per_s"] / rows[("sglang", b)]["tokens_per_s"]
        assert data["embedded_over_sglang"][str(b)] == {"lean": pytest.approx(ratio)}
        assert f"lean / SGLang at batch {b}: {ratio:.2f}x" in stdout
        assert f"SGLang's own time at batch {b}: 0.001 s" in stdout
    assert "| sglang " in stdout and data["complete"] is True and ended(pid_file)


@pytest.mark.gpu
@pytest.mark.sglang
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the sglang runner serves on one)")
def test_real_sglang_row_on_the_gpu(tmp_path: Path) -> None:
    from relax.backends.sglang.launcher import sglang_available

    if not sglang_available():
        pytest.skip("needs sglang 0.5.14 (installed, or RELAX_SGLANG_PYTHONPATH=/tmp/sglsite)")
    out = tmp_path / "engine.json"
    code = be.main(["--runners", "sglang", "--batches", "8", "--prompt", "16", "--new", "32", "--no-hf", "--repeats",
                    "2", "--sglang-model-dir", str(tmp_path / "model"), "--sglang-log", str(tmp_path / "server.log"),
                    "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert code == 0 and not row["error"] and row["tokens_per_s"] > 0 and row["mismatch_mean"] < 0.1
