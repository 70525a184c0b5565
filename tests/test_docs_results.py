"""docs/performance.md's figures are traceable: every results file it links exists, every figure its tables claim
(written in bold) is in a JSON that the row links, every results JSON (or a results folder's provenance.json)
names the command, the commit and the machine that produced it, and the page stays one page of current figures
(the history of attempts is indexed in docs/results/README.md, whose links exist too)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
RESULTS = DOCS / "results"
PAGE = DOCS / "performance.md"
MAX_LINES = 300

# A figure as the page writes it: sign, digits with thousands separators, decimals, an exponent, and a trailing
# "x" (a ratio) or "%" (a share).
FIGURE = re.compile(r"^[-+\u2212]?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?:e([-+]?\d+))?\s*([x%]?)$")
BOLD = re.compile(r"\*\*(.+?)\*\*")
JSON_LINK = re.compile(r"\]\((results/[^)\s#]+\.json)\)")


def test_every_results_link_in_the_performance_page_exists() -> None:
    links = re.findall(r"\]\((results/[^)]*)\)", PAGE.read_text())
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


def _numbers(data: object) -> Iterator[float]:
    """Every numeric value of a JSON document, walked recursively (booleans are not numbers)."""
    if isinstance(data, dict):
        for value in data.values():
            yield from _numbers(value)
    elif isinstance(data, list):
        for value in data:
            yield from _numbers(value)
    elif isinstance(data, (int, float)) and not isinstance(data, bool) and math.isfinite(data):
        yield float(data)


def _matches(text: str, values: list[float]) -> bool:
    """Whether a JSON value, rounded to the decimals the page writes, is the page's figure. A percentage may be
    held as a fraction; an exponent's decimals are the mantissa's (8.63e-3 is 0.00863 to 5 places)."""
    found = FIGURE.match(text.strip())
    assert found, text
    whole, decimals, exponent, unit = found.groups()
    places = len(decimals or "") - int(exponent or 0)
    sign = -1.0 if text.strip()[0] in "-\u2212" else 1.0
    figure = (
        sign
        * float(whole.replace(",", "") + (f".{decimals}" if decimals else ""))
        * 10.0 ** int(exponent or 0)
    )
    half = 0.5 * 10.0**-places
    candidates = [(v, 100 * v) if unit == "%" else (v,) for v in values]
    return any(
        abs(c - figure) <= half * (1 + 1e-9) + 1e-12 * abs(figure) for pair in candidates for c in pair
    )


def _table_rows(text: str) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("|") and not re.fullmatch(r"[\s|:-]*", line):
            yield number, line


def test_every_bold_figure_in_a_table_is_in_a_json_the_row_links() -> None:
    problems = []
    checked = 0
    cache: dict[str, list[float]] = {}
    for number, row in _table_rows(PAGE.read_text()):
        spans = [span for span in BOLD.findall(row) if re.search(r"\d", span)]
        if not spans:
            continue
        where = f"performance.md:{number}: {row[:100]}"
        links = JSON_LINK.findall(row)
        if not links:
            problems.append(f"{where}: bold figures {spans} but the row links no results/*.json")
            continue
        values = []
        for link in links:
            if link not in cache:
                cache[link] = list(_numbers(json.loads((DOCS / link).read_text())))
            values += cache[link]
        for span in spans:
            if not FIGURE.match(span.strip()):
                problems.append(f"{where}: **{span}** is bold text, not a figure: bold the number alone")
            elif not _matches(span, values):
                problems.append(f"{where}: **{span}** is in none of {links}")
            else:
                checked += 1
    assert checked, "no bold figure in performance.md's tables"
    assert problems == [], "\n".join(problems)


def test_the_figure_rule_reads_numbers_as_written() -> None:
    assert _matches("86,814", [86813.867])
    assert not _matches("86,814", [86812.4])
    assert _matches("8.63e-3", [0.0086349])
    assert not _matches("8.63e-3", [0.0086449])
    assert _matches("1.27x", [1.2676])
    assert _matches("12.8%", [0.12846])
    assert _matches("0.0000", [3.7e-5])
    assert _matches("-9.6e-5", [-9.5888e-05])
    assert not _matches("-9.6e-5", [9.5888e-05])


def test_the_performance_page_is_one_page() -> None:
    lines = len(PAGE.read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"performance.md has {lines} lines (at most {MAX_LINES}): move history to results/README.md"
    )


def test_every_link_in_the_results_index_exists() -> None:
    index = RESULTS / "README.md"
    links = [link for link in re.findall(r"\]\(([^)\s#]+)\)", index.read_text()) if "://" not in link]
    assert links, "results/README.md links no results"
    assert [link for link in links if not (RESULTS / link).exists()] == []
