"""--notify-urls (apprise) and --use-clearml (clearml): optional extras, refused at launch in one line when not
installed; with them (here fake packages on PYTHONPATH that record their calls) a run sends its start and finish
(or failure) notices, and reports every step metric to one ClearML task."""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, read_jsonl, run_relax

FAKE_APPRISE = '''
import json, os

def _record(**kw):
    with open(os.environ["FAKE_RECORD"], "a") as f:
        f.write(json.dumps({"module": "apprise", **kw}) + "\\n")

class Apprise:
    def add(self, url):
        _record(call="add", url=url)
        return True

    def notify(self, title, body):
        _record(call="notify", title=title, body=body)
        return True
'''

FAKE_CLEARML = '''
import json, os

def _record(**kw):
    with open(os.environ["FAKE_RECORD"], "a") as f:
        f.write(json.dumps({"module": "clearml", **kw}) + "\\n")

class _Logger:
    def report_scalar(self, title, series, value, iteration):
        _record(call="report_scalar", title=title, series=series, value=value, iteration=iteration)

class Task:
    @classmethod
    def init(cls, project_name=None, task_name=None):
        _record(call="init", project_name=project_name, task_name=task_name,
                offline=os.environ.get("CLEARML_OFFLINE_MODE"))
        return cls()

    def connect(self, config):
        _record(call="connect", keys=sorted(config))
        return config

    def get_logger(self):
        return _Logger()

    def close(self):
        _record(call="close")
'''


@pytest.fixture
def fakes(tmp_path: Path) -> dict[str, str]:
    for name, text in (("apprise", FAKE_APPRISE), ("clearml", FAKE_CLEARML)):
        (tmp_path / "fakes" / name).mkdir(parents=True)
        (tmp_path / "fakes" / name / "__init__.py").write_text(textwrap.dedent(text))
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "fakes"), os.environ.get("PYTHONPATH")])),
            "FAKE_RECORD": str(tmp_path / "calls.jsonl"), "CLEARML_OFFLINE_MODE": "1"}


@pytest.mark.parametrize(("flags", "extra", "module"), [(["--notify-urls", "json://localhost:1/x"], "notify", "apprise"),
                                                        (["--use-clearml"], "clearml", "clearml")])
def test_refused_at_launch_without_the_extra(tmp_path: Path, flags: list[str], extra: str, module: str) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"the {extra} extra is installed here")
    proc = run_relax([*FAST_FLAGS, *flags, "--output-dir", str(tmp_path / "run")], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("relax:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"pip install 'relax-harness[{extra}]'" in lines[0] and flags[0] in lines[0], lines


@pytest.mark.ray
def test_a_run_notifies_and_reports_to_clearml(tmp_path: Path, fakes) -> None:
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--notify-urls", "json://a.example/x, mailto://b@c.example",
                      "--use-clearml", "--tb-project-name", "proj", "--tb-experiment-name", "exp",
                      "--output-dir", str(run)], tmp_path, env=fakes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = read_jsonl(tmp_path / "calls.jsonl")
    notices = [c for c in calls if c["call"] == "notify"]
    assert [c["url"] for c in calls if c["call"] == "add"] == ["json://a.example/x", "mailto://b@c.example"]
    assert [n["title"] for n in notices] == ["relax run exp started", "relax run exp finished"], notices
    assert str(run) in notices[1]["body"]
    ml = [c for c in calls if c["module"] == "clearml"]
    assert ml[0] == {"module": "clearml", "call": "init", "project_name": "proj", "task_name": "exp", "offline": "1"}
    assert ml[1]["call"] == "connect" and "lr" in ml[1]["keys"] and ml[-1]["call"] == "close"
    scalars = [c for c in ml if c["call"] == "report_scalar"]
    metrics = read_jsonl(run / "metrics.jsonl")
    for m in metrics:
        loss = [c for c in scalars if (c["title"], c["series"], c["iteration"]) == ("train", "loss", m["step"])]
        assert len(loss) == 1 and loss[0]["value"] == pytest.approx(m["train/loss"])
    assert {c["iteration"] for c in scalars} == {0, 1}


def test_a_failing_run_sends_the_failure_notice(tmp_path: Path, fakes) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    proc = run_relax([*FAST_FLAGS, "--prompt-data", str(bad), "--notify-urls", "json://a.example/x",
                      "--output-dir", str(tmp_path / "run")], tmp_path, env=fakes)
    assert proc.returncode != 0, proc.stderr[-2000:]
    notices = [c for c in read_jsonl(tmp_path / "calls.jsonl") if c["call"] == "notify"]
    assert [n["title"].rsplit(" ", 1)[1] for n in notices] == ["started", "failed"], notices
    assert "failed (exit" in notices[1]["body"], notices
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"
