"""No import circles in relax/ or harness/, deferred imports included (a circle closed by an import inside a
function still ties the two modules together; ``if TYPE_CHECKING`` imports are annotations only)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    found = {}
    for package in ("relax", "harness"):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _targets(module: str, path: Path, node: ast.AST) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join([*parts, *([base] if base else [])])
    return {base, *(f"{base}.{alias.name}" for alias in node.names)}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(module, path, node):
                while target and target not in modules:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
                    graph[module] |= _packages_run_first(module, target, modules)
    return graph


def _packages_run_first(module: str, target: str, modules: dict[str, Path]) -> set[str]:
    """Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first: edges to those packages too (``module``'s
    own packages are running already). A circle through a package's ``__init__`` breaks an import that starts
    at the wrong module (validation -> rewards/__init__ -> arguments -> validation did)."""
    parts = target.split(".")
    return {p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
            if p in modules and p != module and not module.startswith(p + ".")}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_the_finder_sees_a_circle_closed_by_a_deferred_import() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "relax.weights.transports" in graph["relax.weights.push"]  # top-level imports
    assert "relax.engine.rollout.engine_client" in graph["relax.weights.transports.distributed"]  # deferred ones
    assert "relax.engine.rewards" in graph["relax.utils.validation"]  # the package of a module it imports
