"""A run's failure as one line that names the culprit, and as the record run.json keeps.

Whatever ends a run (a reward function that raises, a ``--reward-key`` typo, bad data, a dead
engine, an error inside a Ray actor) is reported as ``relax: <culprit>: <Type>: <message> at
<file>:<line>``: the culprit is what raised it (a hook's flag and dotted path and the sample index,
attached as an exception note where the hook is called), the file and line are the innermost
frame of the traceback outside the Python library (for an error inside a Ray actor, of the
traceback Ray sends back). The full traceback is printed only with ``--debug`` or ``RELAX_DEBUG=1``.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

DEBUG_ENV = "RELAX_DEBUG"
_LIBRARY_DIRS = tuple(str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "purelib", "platlib"))
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Failure:
    message: str  # one line, without the "relax: " prefix
    type: str  # the original exception's class (inside a Ray actor: the actor's exception)
    where: str | None  # file:line of the innermost frame outside the Python library
    traceback: str  # the full text, for --debug

    def record(self) -> dict[str, str | None]:
        """The fields run.json keeps (``error``, ``error_type``, ``error_where``)."""
        out = asdict(self)
        del out["traceback"]
        return {"error": out["message"], "error_type": out["type"], "error_where": out["where"]}


def debug_requested(debug: bool = False) -> bool:
    """``--debug``, or the environment asks for full tracebacks."""
    return debug or os.environ.get(DEBUG_ENV, "") not in ("", "0", "false")


def _is_library(path: str) -> bool:
    resolved = str(Path(path).resolve())
    return resolved.startswith(_LIBRARY_DIRS) and "/relax/" not in resolved


def _short(path: str) -> str:
    """``path`` relative to the working directory, else to the import root it was loaded from (a
    ``sys.path`` entry: ``tests/recipe_hooks.py`` for ``tests.recipe_hooks``), else as it is."""
    resolved = Path(path).resolve()
    roots = [Path.cwd(), *sorted((Path(p).resolve() for p in sys.path if p and not _is_library(p)),
                                 key=lambda r: -len(str(r)))]
    for root in roots:
        if resolved.is_relative_to(root):
            return str(resolved.relative_to(root))
    return path


def _innermost(frames: list[tuple[str, int]]) -> str | None:
    """The innermost frame outside the Python library (else the innermost), as ``file:line``."""
    if not frames:
        return None
    own = [f for f in frames if not _is_library(f[0])] or frames
    path, line = own[-1]
    return f"{_short(path)}:{line}"


def _frames(tb: TracebackType | None) -> list[tuple[str, int]]:
    return [(f.filename, f.lineno or 0) for f in traceback.extract_tb(tb)]


def unwrap(exc: BaseException) -> tuple[BaseException, str | None]:
    """A Ray task error's original exception and the traceback text Ray brought back (else the exception itself).

    Ray raises its ``RayTaskError(<original class>)``, whose ``cause`` is the actor's exception (notes kept)
    and whose text is the actor-side traceback.
    """
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and type(exc).__name__.startswith("RayTaskError"):
        return cause, _ANSI.sub("", str(exc))
    return exc, None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


_CREATION = re.compile(r"raised in its creation task, (?:ray::)?([\w.]+)\(\)")
_VERDICT = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\w*): (.*)$")


def _creation_failure(exc: BaseException) -> Failure | None:
    """Ray's report of an actor whose ``__init__`` raised (``ActorDiedError``: the original exception is gone, its
    traceback is in the text) as ``in Class.__init__: Type: message at file:line``."""
    text = _ANSI.sub("", str(exc))
    creation = _CREATION.search(text)
    if not getattr(exc, "actor_init_failed", False) or creation is None:
        return None
    verdicts = [m for m in map(_VERDICT.match, text.splitlines()) if m]
    if not verdicts:
        return None
    kind, body = verdicts[-1].group(1).rsplit(".", 1)[-1], verdicts[-1].group(2).strip()
    frames = [(m.group(1), int(m.group(2))) for m in _FRAME.finditer(text)]
    where = _innermost(frames)
    message = f"in {creation.group(1)}: {kind}: {body or '(no message)'}" + (f" at {where}" if where else "")
    return Failure(message, kind, where, "Traceback (most recent call last, in a Ray actor's __init__):\n" + text)


def describe(exc: BaseException) -> Failure:
    """The one-line report of ``exc`` (unwrapping Ray), its type and where it was raised."""
    created = _creation_failure(exc)
    if created is not None:
        return created
    original, remote_tb = unwrap(exc)
    if remote_tb:
        frames = [(m.group(1), int(m.group(2))) for m in _FRAME.finditer(remote_tb)]
        full = "Traceback (most recent call last, in a Ray actor):\n" + remote_tb
    else:
        frames = _frames(original.__traceback__)
        full = "".join(traceback.format_exception(original))
    kind = type(original).__name__
    if kind.startswith("RayTaskError(") and kind.endswith(")"):  # Ray's dual class: report the user's class
        kind = kind[len("RayTaskError("):-1]
    notes = [n for n in getattr(original, "__notes__", ()) if n.strip()]
    body = (_first_line(str(original)) or "(no message)") + _actor(str(original))
    message = f"{kind}: {body}"
    if notes:
        message = f"{_first_line(notes[-1])}: {message}"
    where = _innermost(frames)
    if where:
        message += f" at {where}"
    return Failure(message, kind, where, full)


def _actor(text: str) -> str:
    """`` (EngineActor, pid 123: why)`` when the message is Ray's report of a dead actor: which actor, which
    process, and Ray's reason (its first sentence: a worker that exited, was killed, ran out of memory)."""
    name = re.search(r"class_name: (\w+)", text)
    pid = re.search(r"\bpid: (\d+)", text)
    if not name:
        return ""
    lines = [line for line in text.splitlines()[1:] if line.strip()]
    reason = next((line.strip() for line in lines if not line.startswith("\t")), "")
    reason = re.split(r"(?<=\.) (?=There are some potential|\()", reason)[0][:300]
    return f" ({name.group(1)}" + (f", pid {pid.group(1)}" if pid else "") + (f": {reason})" if reason else ")")
