"""Reading prompt datasets (jsonl, parquet) with errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """Prompt data is missing or malformed; the message is one line naming the culprit."""


def read_records(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"prompt data not found: {p}")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(p)
    if suffix == ".parquet":
        return _read_parquet(p)
    raise DataError(f"{p}: unsupported prompt data format {suffix!r} (use .jsonl or .parquet)")


def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    records = []
    with open(p, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(record, dict):
                raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
    return records


def _read_parquet(p: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(p).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for bad files
        raise DataError(f"{p}: cannot read parquet: {exc}".splitlines()[0]) from None


def require_key(records: list[dict[str, Any]], key: str, path: str | Path) -> None:
    for i, record in enumerate(records, start=1):
        if key not in record:
            raise DataError(f"{path}:{i}: missing key {key!r} (set --input-key)")
