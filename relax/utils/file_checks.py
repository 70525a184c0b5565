"""Weight and checkpoint files a launch names, checked before Ray starts: present and complete.

A truncated ``model.safetensors`` otherwise surfaces minutes later, inside a trainer actor's ``__init__``, as
Ray's report of a dead actor. These checks read headers and sizes only (no tensor data), so they cost
milliseconds: a safetensors file is an 8-byte little-endian header length, a JSON header whose entries give
each tensor's byte range, and the data; its size must cover the last range. A ``.pt`` file (torch's zip
format) must have its zip directory, which sits at the end of the file. A directory a run will write
(``--save``) must be creatable: its nearest existing ancestor a writable directory (nothing is created here).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from relax.checkpoint import CheckpointError, find_latest

INDEX = "model.safetensors.index.json"


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file, or None."""
    size = path.stat().st_size
    if size < 8:
        return f"{path.name} is truncated ({size} bytes; a safetensors file starts with an 8-byte header length)"
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        if 8 + header_len > size:
            return f"{path.name} is truncated ({size} bytes, less than its {header_len}-byte header)"
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, ValueError):
            return f"{path.name} is not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return f"{path.name} is not a safetensors file (its header is not a JSON object)"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return f"{path.name} is not a safetensors file (a header entry has no data_offsets)"
    expected = 8 + header_len + end
    if size < expected:
        return f"{path.name} is truncated ({size} of {expected} bytes)"
    return None


def torch_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete torch checkpoint file (zip format), or None."""
    if not zipfile.is_zipfile(path):
        return f"{path.name} is truncated or not a torch checkpoint ({path.stat().st_size} bytes, no zip directory)"
    return None


def pickle_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete pickle (protocol 2+: starts with PROTO, ends with STOP), or None."""
    with open(path, "rb") as fh:
        head = fh.read(1)
        fh.seek(max(path.stat().st_size - 1, 0))
        tail = fh.read(1)
    if head != b"\x80" or tail != b".":
        return f"{path.name} is truncated or not a pickle ({path.stat().st_size} bytes)"
    return None


def hf_dir_problems(directory: Path, *, needs_model: bool = False) -> list[str]:
    """An HF checkpoint directory's missing or incomplete weight files: every shard its index names, every
    ``*.safetensors`` complete. ``needs_model``: it must also hold config.json and weights (``relax train`` does
    not ask that: a directory with only a tokenizer, or a config, gets its model from the architecture flags)."""
    problems = [] if not needs_model or (directory / "config.json").is_file() else ["no config.json"]
    index = directory / INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return [*problems, f"{INDEX} has no weight_map"]
        files = []
        for shard in shards:
            if (directory / shard).is_file():
                files.append(directory / shard)
            else:
                problems.append(f"{INDEX} names {shard}, which is missing")
    else:
        files = sorted(directory.glob("*.safetensors"))
        if needs_model and not files and not any(directory.glob("*.bin")):
            problems.append("no *.safetensors weights")
    problems += [p for p in map(safetensors_problem, files) if p]
    return problems


def checkpoint_problems(root: Path) -> list[str]:
    """The latest checkpoint under a ``--load`` root: present (`relax.checkpoint.find_latest`) and its files
    complete (safetensors headers, the zip directory of each ``.pt``, the ends of each ``.pkl``)."""
    try:
        directory = find_latest(root)
    except (CheckpointError, ValueError) as exc:
        return [str(exc).removeprefix("--load: ")]
    problems = [p for p in map(safetensors_problem, sorted(directory.glob("*.safetensors"))) if p]
    problems += [p for p in map(torch_file_problem, sorted(directory.glob("*.pt"))) if p]
    problems += [p for p in map(pickle_problem, sorted(directory.glob("*.pkl"))) if p]
    return [f"{directory.name}/{p}" for p in problems]


def writable_dir_problem(path: Path) -> str | None:
    """Why the run could not create ``path`` and write in it, or None; names the free space where it can."""
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a directory"
    stat = os.statvfs(ancestor)
    if stat.f_flag & os.ST_RDONLY:
        return f"{ancestor} is on a read-only file system"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    free = stat.f_bavail * stat.f_frsize
    if free == 0:
        return f"no space left on the device of {ancestor}"
    return None
