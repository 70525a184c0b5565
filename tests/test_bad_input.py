"""Bad input ends with one clear line on stderr, a non-zero exit and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e_helpers import run_relax


def _one_line_error(proc, expected: str) -> None:
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("relax: ") and expected in lines[0], lines[0]


def test_missing_prompt_data(tmp_path: Path) -> None:
    proc = run_relax(["--preset", "quickstart", "--prompt-data", str(tmp_path / "nope.jsonl"),
                      "--output-dir", str(tmp_path / "o")], tmp_path)
    _one_line_error(proc, "nope.jsonl")


def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n{"prompt": "2+2=", "label": \n')
    proc = run_relax(["--preset", "quickstart", "--prompt-data", str(data), "--output-dir", str(tmp_path / "o")],
                     tmp_path)
    _one_line_error(proc, f"{data}:2")


def test_unknown_rm_type(tmp_path: Path) -> None:
    proc = run_relax(["--preset", "quickstart", "--rm-type", "nonsense", "--output-dir", str(tmp_path / "o")],
                     tmp_path)
    _one_line_error(proc, "nonsense")


def test_inconsistent_global_batch_size(tmp_path: Path) -> None:
    proc = run_relax(["--preset", "quickstart", "--global-batch-size", "100", "--output-dir", str(tmp_path / "o")],
                     tmp_path)
    _one_line_error(proc, "--global-batch-size")
    assert proc.returncode == 2


@pytest.mark.parametrize(("flags", "expected"), [
    (["--rlsp-server-port", "9000"], "--rlsp-server-port"),
    (["--allgather-cp"], "--allgather-cp (context parallelism: megatron-core runs it only in Transformer Engine"),
    (["--partial-rollout", "--use-fault-tolerance"], "--partial-rollout with --use-fault-tolerance"),
])
def test_not_supported_yet(tmp_path: Path, flags: list[str], expected: str) -> None:
    proc = run_relax(["--preset", "quickstart", *flags, "--output-dir", str(tmp_path / "o")], tmp_path)
    _one_line_error(proc, f"not supported yet: {expected}")
    assert proc.returncode == 2


def test_a_gpu_only_flag_on_a_machine_without_gpu_names_the_missing_gpu(tmp_path: Path) -> None:
    proc = run_relax(["--preset", "quickstart", "--attention-backend", "flash", "--output-dir", str(tmp_path / "o")],
                     tmp_path)
    _one_line_error(proc, "--attention-backend flash needs a CUDA GPU (flash and fused attention are CUDA kernels); "
                          "--device cpu uses none")
    assert proc.returncode == 2


def test_a_megatron_flag_with_the_torch_backend_names_the_backend(tmp_path: Path) -> None:
    """quickstart trains with --train-backend torch: a Megatron layout conflicts with that, whatever the machine."""
    proc = run_relax(["--preset", "quickstart", "--sequence-parallel", "--output-dir", str(tmp_path / "o")], tmp_path)
    _one_line_error(proc, "--sequence-parallel needs --train-backend megatron")
    assert proc.returncode == 2


@pytest.mark.parametrize(("flag", "expected"), [
    (["--num-data-storage-units", "2"], "--num-data-storage-units has no effect without --fully-async"),
    (["--polling-mode", "false"], "--polling-mode has no effect without --fully-async"),
    (["--fully-async", "--num-data-storage-units", "0"], "--num-data-storage-units must be >= 1, got 0"),
    (["--fully-async", "--max-staleness", "-1"], "--max-staleness must be >= 0, got -1"),
])
def test_data_queue_flags_need_fully_async(tmp_path: Path, flag: list[str], expected: str) -> None:
    proc = run_relax(["--preset", "quickstart", *flag, "--output-dir", str(tmp_path / "o")], tmp_path)
    _one_line_error(proc, expected)
    assert proc.returncode == 2


HOOKS = """
def returns_none(args, *rest):
    return None
"""


@pytest.mark.parametrize(("flag", "path", "expected"), [
    ("--buffer-filter-path", "no_such_module.fn", "--buffer-filter-path: cannot import module 'no_such_module'"),
    ("--rollout-data-postprocess-path", "bad_hooks.missing", "module 'bad_hooks' has no attribute 'missing'"),
    ("--custom-convert-samples-to-train-data-path", "bad_hooks.returns_none",
     "--custom-convert-samples-to-train-data-path returned NoneType"),
])
def test_bad_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str, path: str, expected: str) -> None:
    (tmp_path / "bad_hooks.py").write_text(HOOKS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    proc = run_relax(["--preset", "quickstart", "--num-rollout", "1", flag, path, "--output-dir", str(tmp_path / "o")],
                     tmp_path)
    # the converter fails after Ray started, whose own start-up warnings may precede our line
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("relax: ")]
    assert len(ours) == 1 and expected in ours[0] and flag in ours[0], proc.stderr
