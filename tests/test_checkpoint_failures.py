"""A checkpoint that cannot be written (a full disk) ends the run in one line naming the step, the place and the
free space there; the step that trained is in metrics.jsonl; no torn checkpoint is published (issue 45)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relax.checkpoint import LATEST_FILE, save_failure
from tests.e2e_helpers import read_jsonl, run_relax


def test_save_failure_names_the_step_the_place_and_the_free_space(tmp_path: Path) -> None:
    err = save_failure(tmp_path / "ckpt", 3, OSError(28, "No space left on device", str(tmp_path / "x")))
    assert str(err).startswith(f"checkpoint of step 3 to {tmp_path / 'ckpt'} failed: OSError: [Errno 28] No space "
                               f"left on device: '{tmp_path / 'x'}' (")
    assert str(err).endswith(" MiB free there)") and "\n" not in str(err)
    torch_writer = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4416 vs 4304\nframe #0")
    assert "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 4416 vs 4304 (" in str(
        save_failure(tmp_path, 1, torch_writer))


@pytest.mark.ray
def test_a_full_disk_at_the_checkpoint_ends_the_run_in_one_line(tmp_path: Path) -> None:
    out, save = tmp_path / "run", tmp_path / "ckpt"
    proc = run_relax(["--preset", "quickstart", "--num-rollout", "3", "--save", str(save), "--save-interval", "1",
                      "--output-dir", str(out)], tmp_path, env={"RELAX_FAULT_CKPT_WRITE_FAIL_AT_STEP": "1"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"relax: checkpoint of step 1 to {save} failed: OSError: [Errno 28] No space left on "
                           "device (injected fault)") and last.endswith(" MiB free there)"), last
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 1]  # step 1 trained: it is recorded
    assert (save / LATEST_FILE).read_text().strip() == "0" and not list(save.glob("iter_0000001*"))
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and run["error"].startswith("checkpoint of step 1")
