"""Split a wheelhouse into device-call loads, and put it back together on the GPU machine.

    python3 ci/wheelhouse/wheel_loads.py pack WHEEL_DIR OUT_DIR [--load-mib 54] [--chunk-mib 40]
    python3 ci/wheelhouse/wheel_loads.py assemble STAGE_DIR WHEEL_OUT_DIR

Used for every wheelhouse that travels in several calls: sglang (build_sglang.sh, .sgl/) and megatron-bridge
(build_bridge.sh, .bridge/); install_loads.sh stages and installs them.

A device call carries at most 64 MiB: the working tree (~7 MiB today) plus the carried paths. ``pack`` cuts
every wheel over ``--chunk-mib`` into numbered chunks (as ``split -b`` would: ``NAME.part00``, ``.part01``...),
then places the files into as few loads as first-fit-decreasing finds, each at most ``--load-mib``
(OUT_DIR/load1, load2, ...). Every load holds a copy of ``manifest.json``: each wheel's sha256 and size, and each
chunk's file, sha256, size and load, in joining order. One call ships one load; the GPU machine copies it into
one stage directory (install_loads.sh). ``assemble`` then checks that every file of the manifest is there (else
it names the missing loads and exits 3), checks each file's sha256 (a bad one stops it with a one-line error
naming the file), joins the chunks in order and checks each joined wheel's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

MIB = 1 << 20
MANIFEST = "manifest.json"
MISSING_EXIT = 3


class ManifestError(Exception):
    """A file of the manifest is absent or its bytes do not match."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def split_file(path: Path, out_dir: Path, chunk_bytes: int) -> list[Path]:
    """Cut ``path`` into ``chunk_bytes`` pieces named NAME.part00, .part01, ... (the order to join them)."""
    parts = []
    with path.open("rb") as f:
        for i, block in enumerate(iter(lambda: f.read(chunk_bytes), b"")):
            part = out_dir / f"{path.name}.part{i:02d}"
            part.write_bytes(block)
            parts.append(part)
    return parts


def pack_loads(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """As few loads as first-fit decreasing finds, each summing to at most ``limit`` bytes; then the same number
    of loads balanced (largest file first into the lightest load) when that also stays within the limit."""
    too_big = [name for name, size in sizes.items() if size > limit]
    if too_big:
        raise ValueError(f"larger than one load ({limit / MIB:.1f} MiB): {', '.join(sorted(too_big))}")
    loads = _first_fit_decreasing(sizes, limit)
    balanced: list[list[str]] = [[] for _ in loads]
    weight = [0] * len(loads)
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        i = weight.index(min(weight))
        balanced[i].append(name)
        weight[i] += sizes[name]
    return balanced if max(weight) <= limit else loads


def _first_fit_decreasing(sizes: dict[str, int], limit: int) -> list[list[str]]:
    loads: list[list[str]] = []
    room: list[int] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        i = next((i for i, r in enumerate(room) if r >= sizes[name]), None)
        if i is None:
            loads.append([])
            room.append(limit)
            i = len(loads) - 1
        loads[i].append(name)
        room[i] -= sizes[name]
    return loads


def pack(wheel_dir: Path, out_dir: Path, load_bytes: int, chunk_bytes: int) -> dict:
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"wheel_loads: no wheels in {wheel_dir}")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    flat = out_dir / "flat"
    flat.mkdir(parents=True)
    entries = []
    for wheel in wheels:
        files = split_file(wheel, flat, chunk_bytes) if wheel.stat().st_size > chunk_bytes else \
            [Path(shutil.copy2(wheel, flat / wheel.name))]
        entries.append({"wheel": wheel.name, "sha256": sha256(wheel), "size": wheel.stat().st_size,
                        "chunks": [{"file": p.name, "sha256": sha256(p), "size": p.stat().st_size} for p in files]})
    sizes = {c["file"]: c["size"] for e in entries for c in e["chunks"]}
    loads = pack_loads(sizes, load_bytes)
    where = {name: i + 1 for i, files in enumerate(loads) for name in files}
    for e in entries:
        for c in e["chunks"]:
            c["load"] = where[c["file"]]
    manifest = {"loads": len(loads), "load_limit": load_bytes, "wheels": entries}
    for i, files in enumerate(loads, 1):
        d = out_dir / f"load{i}"
        d.mkdir()
        for name in files:
            (flat / name).rename(d / name)
        (d / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    flat.rmdir()
    for i, files in enumerate(loads, 1):
        print(f"load{i}: {len(files)} files, {sum(sizes[n] for n in files) / MIB:.1f} MiB")
    return manifest


def missing_loads(stage: Path, manifest: dict) -> list[int]:
    return sorted({c["load"] for e in manifest["wheels"] for c in e["chunks"] if not (stage / c["file"]).exists()})


def assemble(stage: Path, out_dir: Path) -> list[Path]:
    """Check and join the staged files into ``out_dir``; raise ManifestError naming the first bad file."""
    manifest = json.loads((stage / MANIFEST).read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    built = []
    for e in manifest["wheels"]:
        for c in e["chunks"]:
            path = stage / c["file"]
            if not path.exists():
                raise ManifestError(f"{c['file']}: missing (it travels in load{c['load']})")
            if path.stat().st_size != c["size"] or sha256(path) != c["sha256"]:
                raise ManifestError(f"{c['file']}: sha256 mismatch (corrupt or truncated; re-send load{c['load']})")
        target = out_dir / e["wheel"]
        with target.open("wb") as dst:
            for c in e["chunks"]:
                with (stage / c["file"]).open("rb") as src:
                    shutil.copyfileobj(src, dst, MIB)
        if sha256(target) != e["sha256"]:
            raise ManifestError(f"{e['wheel']}: sha256 mismatch after joining {len(e['chunks'])} chunks")
        built.append(target)
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="split and pack WHEEL_DIR's wheels into OUT_DIR/load1..N")
    p.add_argument("wheel_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--load-mib", type=float, default=54.0, help="most bytes of one load (64 MiB less the tree)")
    p.add_argument("--chunk-mib", type=float, default=40.0, help="wheels over this are split into such chunks")
    a = sub.add_parser("assemble", help="check STAGE_DIR against its manifest and join the wheels into OUT_DIR")
    a.add_argument("stage", type=Path)
    a.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    if args.cmd == "pack":
        pack(args.wheel_dir, args.out_dir, int(args.load_mib * MIB), int(args.chunk_mib * MIB))
        return
    manifest = json.loads((args.stage / MANIFEST).read_text())
    gone = missing_loads(args.stage, manifest)
    if gone:
        print(f"wheel_loads: waiting for load(s) {', '.join(map(str, gone))} of {manifest['loads']}")
        sys.exit(MISSING_EXIT)
    try:
        built = assemble(args.stage, args.out_dir)
    except ManifestError as e:
        sys.exit(f"wheel_loads: {e}")
    print(f"wheel_loads: {len(built)} wheels checked and joined into {args.out_dir}")


if __name__ == "__main__":
    main()
