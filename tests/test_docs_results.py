"""docs/performance.md's figures are traceable: every results file it links exists, and every results JSON
(or a results folder's provenance.json) names the command, the commit and the machine that produced it."""

from __future__ import annotations

import json
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
RESULTS = DOCS / "results"


def test_every_results_link_in_the_performance_page_exists() -> None:
    links = re.findall(r"\]\((results/[^)]*)\)", (DOCS / "performance.md").read_text())
    assert links, "performance.md links no results"
    assert [link for link in links if not (DOCS / link).exists()] == []


def test_every_result_names_its_command_commit_and_machine() -> None:
    sources = [*RESULTS.glob("*.json"), *RESULTS.glob("*/provenance.json")]
    assert sources
    for path in sources:
        data = json.loads(path.read_text())
        provenance = data.get("provenance", data)
        assert all(provenance.get(key) for key in ("command", "commit", "machine")), path.name
    for folder in (p for p in RESULTS.iterdir() if p.is_dir()):
        assert (folder / "provenance.json").is_file(), f"{folder.name}/ has no provenance.json"
