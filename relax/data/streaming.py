"""Reading prompt files lazily (``--use-streaming-dataset``): a cursor over the files, and a seeded shuffle buffer.

A jsonl file is read line by line from a byte offset; a parquet file by record batches of one row group at a
time (pyarrow), so memory holds the shuffle buffer and one batch, never the dataset. Records come out in epochs:
every record of every file once, then the files start over. With shuffling, a buffer of
``--streaming-buffer-size`` records is filled and each draw takes a random one of them (a generator seeded by
``--rollout-seed + epoch``, as the in-memory loader's permutation is) and refills its slot from the files; at the
end of an epoch the buffer drains before the next epoch starts, so every epoch serves each record exactly once.
Without shuffling records come out in file order, as the in-memory loader serves them.

`state_dict` is plain data: the cursor (file, byte offset or row group and row, record index), the buffered
records themselves, the generator's state and the epoch, so a resumed run draws exactly the records the straight
run would have drawn. Errors are one line naming the file and the 1-based line (jsonl) or row (parquet), the same
numbers the in-memory reader gives.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from relax.data.dataset import DataError, Record, check_prompt_file, missing_key

PARQUET_BATCH_ROWS = 1024


@dataclass
class Drawn:
    """One record drawn from the stream: its epoch, its index in an epoch (across files, as the in-memory loader
    numbers records) and where it is (``file:line``)."""

    epoch: int
    index: int
    where: str
    record: Record


def _parquet_file(p: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(p)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for bad files
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise DataError(f"{p}: cannot read parquet: {first}") from None


def count_records(p: Path) -> int:
    """Records in a file without holding them: parquet metadata, or one pass over a jsonl file's lines."""
    if p.suffix.lower() == ".parquet":
        return _parquet_file(p).metadata.num_rows
    with open(p, "rb") as fh:
        return sum(1 for line in fh if line.strip())


class FileCursor:
    """A position in the prompt files: ``(file, offset, line)``, where offset is a jsonl byte offset or a parquet
    row group, and line the 1-based line (jsonl) or row (parquet) last read; plus the record index in the epoch."""

    def __init__(self, paths: Sequence[Path], required_keys: Sequence[str]):
        self.paths, self.required_keys = list(paths), list(required_keys)
        self.file, self.offset, self.line, self.index = 0, 0, 0, 0
        self._rows: Iterator[tuple[int, int, Record]] | None = None

    def position(self) -> list[int]:
        return [self.file, self.offset, self.line, self.index]

    def seek(self, position: Sequence[int]) -> None:
        self.file, self.offset, self.line, self.index = (int(v) for v in position)
        self._rows = None

    def read(self) -> tuple[int, str, Record] | None:
        """The next record ``(index, where, record)``, or None at the end of the last file."""
        while self.file < len(self.paths):
            if self._rows is None:
                self._rows = self._open(self.paths[self.file])
            row = next(self._rows, None)
            if row is None:
                self.file, self.offset, self.line, self._rows = self.file + 1, 0, 0, None
                continue
            self.offset, self.line, record = row
            where = f"{self.paths[self.file]}:{self.line}"
            for key in self.required_keys:
                if key not in record:
                    raise DataError(f"{where}: {missing_key(key, record)}")
            self.index += 1
            return self.index - 1, where, record
        return None

    def _open(self, p: Path) -> Iterator[tuple[int, int, Record]]:
        """Rows ``(offset after the row, line, record)`` from the current position of file ``p``."""
        return self._parquet(p) if p.suffix.lower() == ".parquet" else self._jsonl(p)

    def _jsonl(self, p: Path) -> Iterator[tuple[int, int, Record]]:
        line, offset = self.line, self.offset
        with open(p, "rb") as fh:
            fh.seek(offset)
            for raw in iter(fh.readline, b""):
                line, offset = line + 1, offset + len(raw)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    at = offset - len(raw) + exc.start
                    raise DataError(f"{p}:{line}: not UTF-8 text ({exc.reason} at byte {at})") from None
                if not text.strip():
                    continue
                try:
                    record = json.loads(text.rstrip("\r\n"))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{p}:{line}: invalid JSON: {exc.msg} (column {exc.colno})") from None
                if not isinstance(record, dict):
                    raise DataError(f"{p}:{line}: expected a JSON object, got {type(record).__name__}")
                yield offset, line, record

    def _parquet(self, p: Path) -> Iterator[tuple[int, int, Record]]:
        """Row group ``offset`` on, from its row ``line - rows before the group`` (a group fully read moves on)."""
        pf = _parquet_file(p)
        meta = pf.metadata
        first_row = sum(meta.row_group(g).num_rows for g in range(self.offset))
        line = self.line
        for group in range(self.offset, meta.num_row_groups):
            skip = line - first_row  # rows of this group already read
            try:
                for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[group]):
                    if skip >= batch.num_rows:
                        skip -= batch.num_rows
                        continue
                    rows = batch.slice(skip).to_pylist()
                    skip = 0
                    for record in rows:
                        line += 1
                        done = line == first_row + meta.row_group(group).num_rows
                        yield (group + 1 if done else group), line, record
            except DataError:
                raise
            except Exception as exc:  # noqa: BLE001 - a corrupt page or column chunk
                first = (str(exc).splitlines() or [type(exc).__name__])[0]
                raise DataError(f"{p}:{line + 1}: cannot read parquet row group {group}: {first}") from None
            first_row += meta.row_group(group).num_rows


class StreamingRecords:
    """Records of ``paths`` in epochs, through a seeded shuffle buffer of ``buffer_size`` records (``shuffle``)."""

    def __init__(self, paths: Sequence[str | Path], *, required_keys: Sequence[str], buffer_size: int,
                 shuffle: bool, seed: int):
        self.paths = [Path(p) for p in paths]
        for p in self.paths:
            check_prompt_file(p)
        self.num_records = sum(count_records(p) for p in self.paths)
        if buffer_size < 1:
            raise DataError(f"--streaming-buffer-size must be >= 1, got {buffer_size}")
        self.buffer_size, self.shuffle, self.seed = buffer_size, shuffle, seed
        self.cursor = FileCursor(self.paths, required_keys)
        self.epoch = 0
        self.exhausted = False  # the cursor reached the end of this epoch's files
        self.buffer: list[list[Any]] = []  # [index, where, record]
        self.rng = np.random.default_rng(seed)

    def next(self) -> Drawn:
        """The next record; a new epoch starts when the files and the buffer are both used up."""
        for _ in range(2):
            if not self.shuffle:
                got = None if self.exhausted else self.cursor.read()
                if got is not None:
                    return Drawn(self.epoch, *got)
                self.exhausted = True
            else:
                while not self.exhausted and len(self.buffer) < self.buffer_size:
                    got = self.cursor.read()
                    if got is None:
                        self.exhausted = True
                        break
                    self.buffer.append(list(got))
                if self.buffer:
                    j = int(self.rng.integers(len(self.buffer)))
                    entry, last = self.buffer[j], self.buffer.pop()
                    if j < len(self.buffer):
                        self.buffer[j] = last
                    return Drawn(self.epoch, *entry)
            self._new_epoch()
        raise DataError(f"{', '.join(map(str, self.paths))}: no records (empty files)")

    def _new_epoch(self) -> None:
        self.epoch += 1
        self.cursor.seek([0, 0, 0, 0])
        self.exhausted = False
        self.rng = np.random.default_rng(self.seed + self.epoch)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor.position(),
            "exhausted": self.exhausted,
            "buffer": [list(entry) for entry in self.buffer],
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.cursor.seek(state["cursor"])
        self.exhausted = state["exhausted"]
        self.buffer = [list(entry) for entry in state["buffer"]]
        self.rng = np.random.default_rng(self.seed + self.epoch)
        self.rng.bit_generator.state = state["rng"]
