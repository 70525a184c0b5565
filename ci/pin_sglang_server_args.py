"""Pin SGLang's ``ServerArgs`` command line as data: relax/backends/sglang/server_args.json.

    python ci/pin_sglang_server_args.py SGLANG_SRC_OR_PACKAGE_DIR [--out relax/backends/sglang/server_args.json]

Reads ``sglang/srt/server_args.py`` as text (``ast``; nothing is imported, so it runs where SGLang's
GPU-only dependencies do not install) and writes, for every option of ``ServerArgs.add_cli_args``,
its long flags, the ``ServerArgs`` field it fills (argparse ``dest``), its action, type, nargs and
literal choices, plus every dataclass field with its annotation and literal default. That is the
interface `relax.backends.sglang.server_args` maps ``--sglang-*`` flags onto where ``sglang`` is not
importable (our GPU machine cannot install it: MACHINES.md). Facts about SGLang's interface, no code.
Where ``sglang`` is installed, tests/sglang/ compares this file with the live ``ServerArgs``.

SGLang 0.5.14 builds most of its command line from ``Annotated[..., Arg(...)]`` field metadata
(``add_cli_args_from_dataclass``), which the text reading cannot see. ``--live`` asks the installed
package instead: ``ServerArgs.add_cli_args`` on a fresh parser, each action recorded in the same shape.

    PYTHONPATH=/tmp/sglsite python3.12 ci/pin_sglang_server_args.py --live    # sglang 0.5.14 importable
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path
from typing import Any


def _literal(node: ast.AST | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _version(root: Path) -> str:
    """From _version.py (a built package), else the wheel's METADATA beside the package."""
    generated = root / "_version.py"
    if generated.is_file():
        m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", generated.read_text())
        if m:
            return m.group(1)
    for meta in sorted(root.parent.glob("sglang-*.dist-info/METADATA")):
        m = re.search(r"^Version: (\S+)", meta.read_text(), re.MULTILINE)
        if m:
            return m.group(1)
    raise SystemExit(f"cannot tell the sglang version of {root} (no _version.py, no sglang-*.dist-info)")


def _server_args_class(path: Path) -> ast.ClassDef:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            return node
    raise SystemExit(f"no class ServerArgs in {path}")


def _options(cls: ast.ClassDef) -> list[dict[str, Any]]:
    options = []
    for node in ast.walk(cls):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        long_flags = [f for f in flags if f.startswith("--")]
        if not long_flags:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        dest = _literal(kw.get("dest")) or long_flags[0][2:].replace("-", "_")
        options.append({
            "flags": long_flags, "dest": dest,
            "action": ast.unparse(kw["action"]) if "action" in kw else None,
            "type": ast.unparse(kw["type"]) if "type" in kw else None,
            "nargs": _literal(kw.get("nargs")) if "nargs" in kw else None,
            "choices": _literal(kw.get("choices")),
        })
    return sorted(options, key=lambda o: o["flags"][0])


def _fields(cls: ast.ClassDef) -> dict[str, dict[str, Any]]:
    out = {}
    for st in cls.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            out[st.target.id] = {"annotation": ast.unparse(st.annotation), "default": _literal(st.value),
                                 "required": st.value is None}
    return out


_ACTIONS = {"_StoreAction": None, "_StoreTrueAction": "'store_true'", "_StoreFalseAction": "'store_false'",
            "_StoreConstAction": "'store_const'", "_AppendAction": "'append'", "_CountAction": "'count'",
            "BooleanOptionalAction": "argparse.BooleanOptionalAction"}


def _live() -> dict[str, Any]:
    """The options and fields of the importable ``sglang``'s ``ServerArgs``, from its own parser."""
    import dataclasses

    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    options = []
    for action in parser._actions:
        long_flags = [f for f in action.option_strings if f.startswith("--")]
        if not long_flags:
            continue
        kind = type(action).__name__
        choices = list(action.choices) if action.choices is not None else None
        options.append({"flags": long_flags, "dest": action.dest, "action": _ACTIONS.get(kind, kind),
                        "type": getattr(action.type, "__name__", None) if action.type is not None else None,
                        "nargs": action.nargs, "choices": choices})
    fields = {}
    for f in dataclasses.fields(ServerArgs):
        default = f.default if f.default is not dataclasses.MISSING else None
        try:
            json.dumps(default)
        except TypeError:
            default = None
        fields[f.name] = {"annotation": str(f.type), "default": default,
                          "required": f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return {"sglang_version": sglang.__version__, "source": "sglang.srt.server_args.ServerArgs.add_cli_args (live)",
            "options": sorted(options, key=lambda o: o["flags"][0]), "fields": fields}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sglang_dir", nargs="?",
                    help="the sglang package directory (…/site-packages/sglang or a source tree's python/sglang)")
    ap.add_argument("--live", action="store_true", help="ask the importable sglang's own parser instead")
    ap.add_argument("--out", default="relax/backends/sglang/server_args.json")
    ns = ap.parse_args()
    if ns.live:
        data = _live()
        Path(ns.out).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{ns.out}: {len(data['options'])} options, {len(data['fields'])} fields of sglang {data['sglang_version']}")
        return
    if not ns.sglang_dir:
        ap.error("give the sglang package directory, or --live")
    root = Path(ns.sglang_dir)
    path = root / "srt" / "server_args.py"
    if not path.is_file():
        raise SystemExit(f"{path} not found")
    cls = _server_args_class(path)
    data = {"sglang_version": _version(root), "source": "sglang/srt/server_args.py ServerArgs",
            "options": _options(cls), "fields": _fields(cls)}
    Path(ns.out).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{ns.out}: {len(data['options'])} options, {len(data['fields'])} fields of sglang {data['sglang_version']}")


if __name__ == "__main__":
    main()
