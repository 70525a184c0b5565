"""Reading prompt datasets (``.jsonl``, ``.parquet``) with one-line errors naming file and line.

Line numbers are 1-based file lines for jsonl (blank lines are skipped but still counted) and
1-based row numbers for parquet.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """Prompt data is missing or malformed; the message is one line naming the culprit."""


Record = dict[str, Any]


def _read_jsonl(p: Path) -> list[tuple[int, Record]]:
    rows: list[tuple[int, Record]] = []
    try:
        with open(p, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{p}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
                if not isinstance(record, dict):
                    raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(record).__name__}")
                rows.append((lineno, record))
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return rows


def _read_parquet(p: Path) -> list[tuple[int, Record]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for bad files
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise DataError(f"{p}: cannot read parquet: {first}") from None
    return list(enumerate(table.to_pylist(), start=1))


READERS: dict[str, Callable[[Path], list[tuple[int, Record]]]] = {
    ".jsonl": _read_jsonl,
    ".parquet": _read_parquet,
}


def check_prompt_file(p: Path) -> None:
    """A prompt file this module reads, or one line saying what ``p`` is instead."""
    if p.is_dir():
        raise DataError(f"prompt data {p} is a directory; give a {' or '.join(READERS)} file, or a list of them")
    if not p.is_file():
        raise DataError(f"prompt data not found: {p}")
    if p.suffix.lower() not in READERS:
        raise DataError(f"{p}: unsupported prompt data format {p.suffix!r} (use {' or '.join(READERS)})")


def read_records(path: str | Path, *, required_keys: Sequence[str] = ()) -> list[Record]:
    """All records of a prompt file, in file order.

    ``required_keys`` (e.g. the ``--input-key``) are checked here, where true line numbers are known.
    """
    p = Path(path)
    check_prompt_file(p)
    rows = READERS[p.suffix.lower()](p)
    for lineno, record in rows:
        for key in required_keys:
            if key not in record:
                raise DataError(f"{p}:{lineno}: {missing_key(key, record)}")
    return [record for _, record in rows]


def missing_key(key: str, record: Record) -> str:
    """``missing key 'x' (the record has keys: a, b)``: what the user can pass to --input-key / --label-key."""
    return f"missing key {key!r} (the record has keys: {', '.join(map(str, record)) or 'none'})"


def prompt_files(value: str | Sequence[str]) -> list[str]:
    """The files of ``--prompt-data``: one path, or a list of them, read in order.

    Seed 004 writes the list as one string, ``--prompt-data "['/data/a.parquet', '/data/b.parquet']"``;
    a JSON or Python list literal is accepted, and a config file may give a YAML list.
    """
    if isinstance(value, list | tuple):
        items = list(value)
    else:
        text = str(value).strip()
        items = [text]
        if text.startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError:
                try:
                    items = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise DataError(f"--prompt-data {text!r} is not a list of paths "
                                    "(write ['a.jsonl', 'b.parquet'], or a single path)") from None
    if not isinstance(items, list) or not items or not all(isinstance(i, str) and i.strip() for i in items):
        raise DataError(f"--prompt-data {value!r} must name one or more files")
    return [i.strip() for i in items]
