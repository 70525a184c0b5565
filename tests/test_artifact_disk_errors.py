"""A full or read-only disk under the output dir: one line naming the file and the free space there, and run.json
never left as a stray temporary file (issue 45)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from relax.metrics.artifacts import JsonlWriter, RunArtifacts


def test_run_json_that_cannot_be_written_keeps_the_old_one_and_no_tmp(tmp_path: Path, monkeypatch) -> None:
    artifacts = RunArtifacts(tmp_path)
    artifacts.write_run_json({"status": "running"})

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as info:
        artifacts.write_run_json({"status": "completed"})
    monkeypatch.undo()
    message = str(info.value)
    assert message.startswith(f"[Errno 28] cannot write {tmp_path / 'run.json'}: No space left on device (")
    assert message.endswith(" MiB free there)") and "\n" not in message
    assert json.loads((tmp_path / "run.json").read_text()) == {"status": "running"}
    assert not (tmp_path / "run.json.tmp").exists()
    artifacts.close()


def test_a_jsonl_write_on_a_full_disk_names_the_file(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "metrics.jsonl")

    class Full:
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self) -> None:
            pass

        def close(self) -> None:
            pass

    writer._fh.close()
    writer._fh = Full()
    with pytest.raises(OSError, match=r"cannot write .*metrics\.jsonl: No space left on device \(.* MiB free there\)"):
        writer.write({"step": 1})
