"""Every kind of engine actor answers what the runtime asks of engine actors.

The runtime calls these on each engine's hosting actor (relax/core/: ``pid`` for health, ``endpoint`` at start,
``device_bytes`` around colocate offload, ``freeze_gc`` after the first steps). Only the embedded engine's actor
runs on CI; the SGLang one needs SGLang on a GPU, where its missing ``device_bytes`` once failed the first
colocate step. Both classes are read from their source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CALLED_ON_ENGINE_ACTORS = {"pid", "endpoint", "device_bytes", "freeze_gc"}
ROOT = Path(__file__).resolve().parents[1]


def _remote_class_methods(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    assert any(ast.unparse(d).startswith("ray.remote") for d in cls.decorator_list), f"{name} is not a Ray actor"
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize(("path", "name"), [("relax/distributed/engine_actor.py", "EngineActor"),
                                            ("relax/backends/sglang/launcher.py", "SGLangEngineActor")])
def test_engine_actors_answer_what_the_runtime_calls(path: str, name: str) -> None:
    missing = CALLED_ON_ENGINE_ACTORS - _remote_class_methods(ROOT / path, name)
    assert not missing, f"{name} lacks {sorted(missing)}"


def test_the_list_is_what_relax_core_calls() -> None:
    """Each name is called on an engine actor somewhere in relax/ (a stale list guards nothing)."""
    source = "\n".join(p.read_text() for p in (ROOT / "relax").rglob("*.py"))
    for method in CALLED_ON_ENGINE_ACTORS:
        assert f".{method}.remote(" in source, method
