"""Repack a wheel without the parts relax never loads, so that the GPU wheelhouse fits one device transfer.

    python ci/wheelhouse/repack.py IN.whl OUT_DIR --drop PREFIX [--drop PREFIX ...]

A device call carries at most 64 MiB, and ray 2.60's wheel is 79 MB: 34 MB of it is ``ray/jars`` (Ray's
Java workers) and 7 MB the dashboard's web client, neither of which a Python driver with
``include_dashboard=False`` or ``ray start --include-dashboard=false`` touches. The repacked wheel keeps
every other file byte for byte (same names, same compression), and its RECORD lists exactly what it holds,
so pip installs it as it would the original. The name is unchanged: it is the same distribution, minus
files nothing imports.

``substitute`` (from Python only: bridge_closure.py's PATCHES) also edits a text file in place: each ``(old, new)``
must occur exactly once in it, and its RECORD line gets the new sha256 and size.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _substituted(name: str, data: bytes, edits: list[tuple[str, str]]) -> bytes:
    text = data.decode()
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"repack: {name} holds {text.count(old)} copies of {old!r}, expected 1")
        text = text.replace(old, new)
    return text.encode()


def repack(wheel: Path, out_dir: Path, drop: list[str],
           substitute: dict[str, list[tuple[str, str]]] | None = None) -> Path:
    substitute = substitute or {}
    if not drop and not substitute:
        raise SystemExit("repack: name at least one --drop prefix or substitution")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel.name
    if target.resolve() == wheel.resolve():
        raise SystemExit(f"repack: {target} would overwrite its input")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w") as dst:
        names = src.namelist()
        records = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]  # its own, top level
        if len(records) != 1:
            raise SystemExit(f"repack: {wheel} has {len(records)} top-level RECORD files, expected 1")
        dropped = [n for n in names if n.startswith(tuple(drop))]
        unused = [p for p in drop if not any(n.startswith(p) for n in names)]
        if unused:
            raise SystemExit(f"repack: no file of {wheel.name} starts with {', '.join(unused)}")
        missing = sorted(set(substitute) - set(names))
        if missing:
            raise SystemExit(f"repack: {wheel.name} has no {', '.join(missing)}")
        kept = set(names) - set(dropped)
        edited = {path: _substituted(path, src.read(path), edits) for path, edits in substitute.items()}
        for info in src.infolist():
            if info.filename in kept and info.filename != records[0]:
                data = edited.get(info.filename) or src.read(info.filename)
                dst.writestr(info, data, compress_type=info.compress_type)  # sets info's CRC and sizes
        lines = src.read(records[0]).decode().splitlines()
        record = [line for line in lines if line.split(",", 1)[0] in kept]
        record = [_record_line(n, edited[n]) if n in edited else line
                  for line, n in ((line, line.split(",", 1)[0]) for line in record)]
        dst.writestr(src.getinfo(records[0]), "\n".join(record) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    print(f"repack: {wheel.name}: dropped {len(dropped)} files under {', '.join(drop) or '-'}, "
          f"edited {len(substitute)}; "
          f"{wheel.stat().st_size / 2**20:.1f} -> {target.stat().st_size / 2**20:.1f} MiB")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--drop", action="append", default=[], help="path prefix inside the wheel to leave out")
    args = parser.parse_args()
    repack(args.wheel, args.out_dir, args.drop)


if __name__ == "__main__":
    main()
