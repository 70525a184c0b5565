"""Resolve a package's runtime closure for the GPU machine and write a lock that pins every wheel by sha256.

Shared by sglang_closure.py (sglang 0.5.14) and bridge_closure.py (megatron-bridge 0.6.2); each gives a `Closure`:
its root requirements, what it imports without declaring (UNDECLARED) and what it declares but the run never
imports (EXCLUDED), each with its reason. Starting from the roots, `resolve` downloads each wheel (cp312, manylinux
x86_64, ``--no-deps``), reads its ``Requires-Dist`` and evaluates the markers for the GPU machine (Linux, x86_64,
CPython 3.12), with the extras a requirement names and no others, and recurses. It stops at:

* what the GPU machine already has (gpu_machine_packages.txt, plus the closure's ``provided``: relax's own
  wheelhouse), unless a requirement excludes the version known there: then the required version is carried (it
  lands in the closure's own --target dir, first on PYTHONPATH, so relax's environment keeps the machine's);
* EXCLUDED: their own dependencies are not followed either.

Unpinned requirements get the newest release that satisfies every specifier met in the closure; the lock pins
exactly that file by its sha256, so ``pip download --require-hashes -r LOCK`` fetches the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:  # pip always vendors it
    from pip._vendor.packaging.markers import Marker  # noqa: F401
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version

HERE = Path(__file__).resolve().parent
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]
MARKER_ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "",
    "platform_version": "",
}


@dataclass(frozen=True)
class Closure:
    """What one wheelhouse is: ``title`` heads its lock, ``script`` and ``build`` name the scripts that write and
    fetch it; ``provided``: packages relax's own wheelhouse (ci/wheelhouse/build.sh) installs, name -> version;
    ``notes``: more lock header lines (a repack, a patch)."""

    title: str
    script: str
    build: str
    roots: list[str]
    undeclared: dict[str, str]
    excluded: dict[str, str]
    provided: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def machine_packages(path: Path) -> dict[str, Version | None]:
    out: dict[str, Version | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, *ver = line.split()
            out[norm(name)] = Version(ver[0]) if ver else None
    return out


@dataclass
class Pick:
    name: str
    version: str
    wheel: Path
    requires: list[Requirement]
    extras: set[str] = field(default_factory=set)
    parents: set[str] = field(default_factory=set)


def download(req: str, cache: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d", str(cache), req]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"closure: pip download {req} failed:\n{out.stderr[-2000:]}")
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(?:Saved|File was already downloaded) (\S+\.whl)", line)
        if m:
            return Path(m.group(1))
    raise SystemExit(f"closure: pip download {req} saved no wheel:\n{out.stdout[-2000:]}")


def metadata(wheel: Path) -> tuple[str, str, list[Requirement]]:
    with zipfile.ZipFile(wheel) as z:
        meta = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        msg = Parser().parsestr(z.read(meta[0]).decode())
    return msg["Name"], msg["Version"], [Requirement(r) for r in msg.get_all("Requires-Dist") or []]


def wanted(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in (extras or {""}) | {""})


def resolve(cache: Path, machine: dict[str, Version | None],
            spec: Closure) -> tuple[dict[str, Pick], dict[str, list[str]]]:
    picks: dict[str, Pick] = {}
    for _ in range(10):  # passes until no pick changes
        specs: dict[str, SpecifierSet] = {}
        extras: dict[str, set[str]] = {}
        parents: dict[str, set[str]] = {}
        on_machine: dict[str, list[str]] = {}
        queue = [(Requirement(r), "<root>") for r in spec.roots] + [(Requirement(r), "<undeclared>")
                                                                   for r in spec.undeclared]
        seen: set[str] = set()
        changed = False
        while queue:
            req, parent = queue.pop(0)
            key = norm(req.name)
            if key in spec.excluded:
                continue
            have = machine.get(key, False)
            if have is not False and (have is None or req.specifier.contains(have, prereleases=True)):
                on_machine.setdefault(key, []).append(f"{req.specifier or 'any'} (from {parent})")
                continue
            specs[key] = specs.get(key, SpecifierSet()) & req.specifier
            extras.setdefault(key, set()).update(req.extras)
            parents.setdefault(key, set()).add(parent)
            pick = picks.get(key)
            if pick is None or not specs[key].contains(pick.version, prereleases=True):
                wheel = download(f"{req.name}{specs[key]}", cache)
                name, version, requires = metadata(wheel)
                picks[key] = pick = Pick(name, version, wheel, requires)
                changed = True
            state = (key, tuple(sorted(extras[key])))
            if state in seen:
                continue
            seen.add(state)
            queue += [(r, pick.name) for r in pick.requires if wanted(r, extras[key])]
        picks = {k: v for k, v in picks.items() if k in specs}
        for k, p in picks.items():
            p.extras, p.parents = extras[k], parents[k]
        if not changed:
            return picks, on_machine
    raise SystemExit("closure: no fixed point after 10 passes")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_lock(path: Path, picks: dict[str, Pick], on_machine: dict[str, list[str]],
               machine: dict[str, Version | None], spec: Closure) -> None:
    total = sum(p.wheel.stat().st_size for p in picks.values())
    lines = [
        f"# {spec.title} for the GPU machine: every wheel it lacks there, pinned by file hash.",
        f"# Written by ci/wheelhouse/{spec.script}; fetched by ci/wheelhouse/{spec.build} with",
        f"#   pip download --no-deps --require-hashes -r ci/wheelhouse/{path.name}",
        f"# {len(picks)} wheels, {total / 1e6:.1f} MB before repacking.",
        *[f"# {line}" if line else "#" for line in spec.notes],
        *(["#", f"# Added: imported by {spec.title.split()[0]} but not declared ({spec.script} UNDECLARED):",
            *[f"#   {k}: {why}" for k, why in sorted(spec.undeclared.items())]] if spec.undeclared else []),
        "#",
        f"# Left out on purpose ({spec.script} EXCLUDED; their own dependencies are not followed):",
        *[f"#   {k}: {why}" for k, why in sorted(spec.excluded.items())],
        "#",
        "# Taken from the GPU machine (gpu_machine_packages.txt); '?' = version not read there, assumed to fit:",
        *[f"#   {k} {machine[k] or '?'}: {'; '.join(sorted(set(v)))}" for k, v in sorted(on_machine.items())
          if k not in spec.provided],
    ]
    if spec.provided:
        lines += ["#", "# Taken from relax's own wheelhouse (ci/wheelhouse/build.sh, installed into /tmp/site):",
                  *[f"#   {k} {machine[k]}: {'; '.join(sorted(set(v)))}" for k, v in sorted(on_machine.items())
                    if k in spec.provided]]
    lines.append("")
    for key in sorted(picks):
        p = picks[key]
        lines.append(f"# {p.wheel.name} ({p.wheel.stat().st_size / 1e6:.1f} MB) <- {', '.join(sorted(p.parents))}")
        lines.append(f"{p.name}=={p.version} --hash=sha256:{sha256(p.wheel)}")
    path.write_text("\n".join(lines) + "\n")
    print(f"closure: {len(picks)} wheels, {total / 1e6:.1f} MB -> {path}")


def main(spec: Closure, lock: Path, description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cache", type=Path, required=True, help="where the downloaded wheels are kept")
    parser.add_argument("--lock", type=Path, default=lock)
    parser.add_argument("--machine", type=Path, default=HERE / "gpu_machine_packages.txt")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    machine = {**machine_packages(args.machine), **{norm(k): Version(v) for k, v in spec.provided.items()}}
    picks, on_machine = resolve(args.cache, machine, spec)
    write_lock(args.lock, picks, on_machine, machine, spec)
