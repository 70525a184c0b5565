"""One run per output directory (relax/metrics/run_dir.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from relax.metrics.run_dir import claim_run_dir
from relax.utils.flag_types import ConfigError


def test_a_live_run_holds_its_directory(tmp_path: Path) -> None:
    lock, notice = claim_run_dir(tmp_path, resuming=False, overwrite=False)
    assert notice is None
    with pytest.raises(ConfigError, match=rf"is in use by another run \(pid \d+ on {socket.gethostname()}, started "):
        claim_run_dir(tmp_path, resuming=False, overwrite=True)  # not even --overwrite-output-dir takes it
    lock.release()
    claim_run_dir(tmp_path, resuming=True, overwrite=False)[0].release()  # free once the run ends


def test_a_finished_run_is_resumed_or_replaced_never_appended_to_silently(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed"}))
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ConfigError, match="holds a finished run \\(status completed\\); resume it with --load"):
        claim_run_dir(tmp_path, resuming=False, overwrite=False)
    lock, notice = claim_run_dir(tmp_path, resuming=True, overwrite=False)
    lock.release()
    assert notice.startswith("--load: appending to the artifacts of the run in") and (tmp_path / "metrics.jsonl").exists()
    lock, notice = claim_run_dir(tmp_path, resuming=False, overwrite=True)
    lock.release()
    assert notice is None and not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "run.json").exists()


def test_an_output_dir_under_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="--output-dir .*/file/run: cannot create it or write in it "
                                          r"\(.*/file is a file, not a directory\)$"):
        claim_run_dir(tmp_path / "file" / "run", resuming=False, overwrite=False)


def test_an_output_dir_that_cannot_be_written_is_one_line_saying_why() -> None:
    """/proc/sys: a tree no one may create files in (read-only or not writable, by the file system's own flags)."""
    with pytest.raises(ConfigError) as info:
        claim_run_dir("/proc/sys/relax_run", resuming=False, overwrite=False)
    assert str(info.value) in ("--output-dir /proc/sys/relax_run: cannot create it or write in it (/proc/sys is "
                               f"{why})" for why in ("not writable", "on a read-only file system"))
