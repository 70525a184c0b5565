"""``relax convert-data IN.parquet OUT.parquet|OUT.jsonl``: a verl RL dataset into relax's columns.

verl's parquet rows hold ``prompt`` (chat messages), ``reward_model`` (``{"style": ..., "ground_truth":
...}``), ``data_source`` and ``extra_info``. Seed 004 says what relax needs instead; each output row has:

* ``prompt``: the messages as they are (train with ``--input-key prompt --apply-chat-template``);
* ``label``: ``reward_model.ground_truth`` as a plain string (a list or dict as its JSON), for
  ``--label-key label`` and ``sample.label``;
* ``extra_info``: verl's ``extra_info`` plus ``data_source``, for ``--metadata-key extra_info``
  (``sample.metadata["data_source"]`` is where seed 004 puts verl's data source);
* ``data_source``, and any image column (``images``) unchanged.

A row without a ground truth, or whose prompt is neither a string nor a list of messages, is an
error naming the file, the row and the keys the row has. Nothing is dropped silently.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from relax.data.dataset import DataError, missing_key, read_records

KEPT = ("data_source", "images")


def _label(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _decoded(value: Any) -> Any:
    """Parquet writers sometimes store nested columns as JSON strings."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def convert_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    if "prompt" not in row:
        raise DataError(f"{where}: {missing_key('prompt', row)}")
    prompt = _decoded(row["prompt"])
    if not isinstance(prompt, str) and not (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)):
        raise DataError(f"{where}: prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    reward_model = _decoded(row.get("reward_model"))
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise DataError(f"{where}: no reward_model.ground_truth (the row has keys: {', '.join(map(str, row))}; "
                        f"reward_model is {reward_model!r})")
    extra = _decoded(row.get("extra_info")) or {}
    if not isinstance(extra, dict):
        extra = {"value": extra}
    out = {"prompt": prompt, "label": _label(reward_model["ground_truth"]),
           "extra_info": {**extra, "data_source": row.get("data_source")}}
    out.update({key: row[key] for key in KEPT if key in row})
    return out


def _write(rows: list[dict[str, Any]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":
        with open(out, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # extra_info dicts of mixed shapes: keep them as JSON text
        table = pa.Table.from_pylist([{**r, "extra_info": json.dumps(r["extra_info"], ensure_ascii=False)}
                                      for r in rows])
    pq.write_table(table, out)


def convert(src: str | Path, out: str | Path) -> int:
    src, out = Path(src), Path(out)
    if out.suffix not in (".parquet", ".jsonl"):
        raise DataError(f"{out}: the output must end in .parquet or .jsonl")
    records = read_records(src)
    rows = [convert_row(r, f"{src}:{i + 1}") for i, r in enumerate(records)]
    _write(rows, out)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relax convert-data", description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="verl parquet (or jsonl) with prompt, reward_model, data_source, extra_info")
    parser.add_argument("out", help="output .parquet or .jsonl")
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        n = convert(ns.src, ns.out)
    except DataError as exc:
        print(f"relax: {exc}", file=sys.stderr)
        return 2
    print(f"relax: converted {n} rows: {ns.src} -> {ns.out} (columns prompt, label, extra_info, data_source); train "
          "with --input-key prompt --label-key label --metadata-key extra_info --apply-chat-template")
    return 0


if __name__ == "__main__":
    sys.exit(main())
