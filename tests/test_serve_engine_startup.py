"""``relax serve-engine`` start-up failures: each one line on stderr and exit 2, before any model loads
(issue 45: a missing or truncated checkpoint, a port in use and --port 99999 were tracebacks)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from relax.backends.embedded import server


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert server.main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_missing_checkpoint(capsys, tmp_path: Path) -> None:
    line = _fails(capsys, "--hf-checkpoint", str(tmp_path / "nope"), "--port", "0")
    assert line.startswith(f"relax serve-engine: --hf-checkpoint '{tmp_path / 'nope'}' is neither a model preset nor "
                           "an existing directory; presets: ")


def test_a_truncated_checkpoint(capsys, tmp_path: Path) -> None:
    from relax.models.registry import build_model, load_tokenizer, save_hf

    model_dir = save_hf(build_model("tiny-qwen3", seed=1), load_tokenizer("tiny-qwen3"), tmp_path / "hf")
    capsys.readouterr()  # transformers' progress bar while saving
    weights = model_dir / "model.safetensors"
    full = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(full - 1000)
    assert _fails(capsys, "--hf-checkpoint", str(model_dir), "--port", "0") == (
        f"relax serve-engine: --hf-checkpoint {model_dir}: model.safetensors is truncated ({full - 1000} of {full} bytes)")


def test_a_port_in_use_and_a_port_out_of_range(capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert _fails(capsys, "--hf-checkpoint", "tiny-qwen3", "--port", str(port)) == (
            f"relax serve-engine: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use)")
    assert _fails(capsys, "--hf-checkpoint", "tiny-qwen3", "--port", "99999") == (
        "relax serve-engine: --port 99999: a TCP port is 0-65535 (0 picks a free one)")


@pytest.mark.parametrize(("text", "problem"), [
    (None, "No such file or directory"),
    ("{not json", "not JSON"),
    ('{"family": "gpt2", "config": {}}', "family 'gpt2' is not one of qwen3, qwen2, llama"),
    ("[1]", 'expected an object with a "config" object'),
])
def test_a_bad_model_config_json(capsys, tmp_path: Path, text: str | None, problem: str) -> None:
    path = tmp_path / "model.json"
    if text is not None:
        path.write_text(text)
    line = _fails(capsys, "--model-config-json", str(path), "--port", "0")
    assert line.startswith(f"relax serve-engine: --model-config-json {path}: ") and problem in line, line


def test_the_command_exits_2_with_the_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "relax.cli", "serve-engine", "--hf-checkpoint", "tiny-qwen3",
                           "--port", "99999"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "relax serve-engine: --port 99999: a TCP port is 0-65535 (0 picks a free one)"), proc.stderr
