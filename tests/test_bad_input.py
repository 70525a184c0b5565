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


@pytest.mark.parametrize("flag", [["--partial-rollout"], ["--offload"], ["--use-routing-replay"]])
def test_not_supported_yet(tmp_path: Path, flag: list[str]) -> None:
    proc = run_relax(["--preset", "quickstart", *flag, "--output-dir", str(tmp_path / "o")], tmp_path)
    _one_line_error(proc, f"not supported yet: {flag[0]}")
    assert proc.returncode == 2
