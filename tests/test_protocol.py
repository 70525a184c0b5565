"""relax/engine/protocol.py is SGLang 0.5.14's HTTP protocol.

Two layers:
* the changes from 0.5.10.post1 that touch what relax sends or serves, written out here (always runs);
* the whole tables against SGLang's own source, read as text (``ast``), so no GPU, kernel or import of
  SGLang is needed: the source is the installed ``sglang`` package's directory, or the directory that
  ``RELAX_SGLANG_SOURCE`` names (an unpacked wheel: ``RELAX_SGLANG_SOURCE=/tmp/sgl514``). Skipped, with
  the reason, where neither is at hand. ``tests/sglang/`` checks the same tables by importing SGLang.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import pytest

from relax.backends.embedded.weights_checker import ONE_RANK
from relax.engine.protocol import (
    ENDPOINTS,
    ENDPOINTS_BY_PATH,
    GENERATE_REQ,
    REQUIRED,
    SAMPLING_NONE_IS_DEFAULT,
    SAMPLING_PARAMS,
    SGLANG_VERSION,
    WEIGHTS_CHECKER_ACTIONS,
    check_fields,
)

# What 0.5.14 added to the requests in the table (nothing was removed or renamed, no default changed but
# CheckWeightsReqInput.action's, which became optional)
ADDED_IN_0_5_14 = {
    "/generate": {"mm_hashes": None, "use_audio_in_video": False, "return_indexer_topk": False,
                  "positional_embed_overrides": None, "return_prompt_token_ids": False, "mm_data_mooncake": None,
                  "encoder_urls": None, "multi_item_delimiter_indices": None},
    "/continue_generation": {"torch_empty_cache": True},
    "/update_weights_from_tensor": {"torch_empty_cache": False},
    "/update_weights_from_distributed": {"torch_empty_cache": False},
}


def test_pinned_at_0_5_14() -> None:
    assert SGLANG_VERSION == "0.5.14"
    for path, added in ADDED_IN_0_5_14.items():
        fields = ENDPOINTS_BY_PATH[path].fields
        assert {k: fields[k] for k in added} == added, path
    checker = ENDPOINTS_BY_PATH["/weights_checker"]
    assert checker.methods == ("GET", "POST") and checker.fields["action"] == "checksum"
    assert "checksum" in WEIGHTS_CHECKER_ACTIONS
    assert len(GENERATE_REQ) == 58  # BaseReq's rid and http_worker_ipc, and 56 of its own (48 in 0.5.10.post1)


def test_none_means_the_default_where_sglang_says_so() -> None:
    """0.5.14's SamplingParams reads null as the default for these: a null is not a value to refuse."""
    body = {k: None for k in SAMPLING_NONE_IS_DEFAULT}
    check_fields(body, SAMPLING_PARAMS, frozenset(), "sampling_params", SAMPLING_NONE_IS_DEFAULT)
    with pytest.raises(ValueError, match="min_p=None is not implemented"):
        check_fields({"min_p": None}, SAMPLING_PARAMS, frozenset(), "sampling_params")


# ---------------------------------------------------------------------- against SGLang's source
def _source() -> Path:
    given = os.environ.get("RELAX_SGLANG_SOURCE")
    if given:
        root = Path(given)
        return root / "sglang" if (root / "sglang").is_dir() else root
    spec = importlib.util.find_spec("sglang")  # finds the package; imports nothing
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no SGLang source: install sglang or set RELAX_SGLANG_SOURCE to an unpacked wheel")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def sglang_dir() -> Path:
    root = _source()
    if not (root / "srt" / "managers" / "io_struct.py").is_file():
        pytest.skip(f"{root} holds no sglang/srt/managers/io_struct.py")
    return root


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _default(node: ast.expr | None) -> object:
    if node is None:
        return REQUIRED
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field":
        kw = {k.arg: k.value for k in node.keywords}
        return ast.literal_eval(kw["default"]) if "default" in kw else REQUIRED
    return ast.literal_eval(node)


def _dataclass_fields(module: ast.Module) -> dict[str, dict[str, object]]:
    """Every class's annotated fields with their defaults, its bases' first (io_struct's dataclasses)."""
    classes = {n.name: n for n in module.body if isinstance(n, ast.ClassDef)}

    def fields(name: str) -> dict[str, object]:
        out: dict[str, object] = {}
        for base in classes[name].bases:
            if isinstance(base, ast.Name) and base.id in classes:
                out.update(fields(base.id))
        for st in classes[name].body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) \
                    and not ast.unparse(st.annotation).startswith("ClassVar"):
                out[st.target.id] = _default(st.value)
        return out

    return {name: fields(name) for name in classes}


def _routes(module: ast.Module) -> dict[str, set[str]]:
    """http_server.py's ``@app.get/post/put/api_route(path, methods=[...])`` decorators."""
    routes: dict[str, set[str]] = {}
    for fn in module.body:
        if not isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                    and getattr(dec.func.value, "id", None) == "app" and dec.args
                    and isinstance(dec.args[0], ast.Constant)):
                continue
            kind = dec.func.attr
            if kind == "api_route":
                methods = next(ast.literal_eval(k.value) for k in dec.keywords if k.arg == "methods")
            elif kind in ("get", "post", "put", "delete"):
                methods = [kind.upper()]
            else:
                continue
            routes.setdefault(dec.args[0].value, set()).update(methods)
    return routes


def _function(module: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    klass = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.sglang  # reads SGLang's source: RELAX_SGLANG_SOURCE or an installed sglang
def test_the_source_is_the_pinned_version(sglang_dir: Path) -> None:
    version: dict = {}
    exec((sglang_dir / "_version.py").read_text(), version)  # the wheel's generated version file
    assert version["__version__"] == SGLANG_VERSION


@pytest.mark.sglang  # reads SGLang's source: RELAX_SGLANG_SOURCE or an installed sglang
def test_request_tables_are_io_structs(sglang_dir: Path) -> None:
    io = _dataclass_fields(_module(sglang_dir / "srt" / "managers" / "io_struct.py"))
    for e in ENDPOINTS:
        if e.request is not None:
            assert io[e.request] == e.fields, e.path


@pytest.mark.sglang  # reads SGLang's source: RELAX_SGLANG_SOURCE or an installed sglang
def test_endpoints_and_methods_are_http_servers(sglang_dir: Path) -> None:
    routes = _routes(_module(sglang_dir / "srt" / "entrypoints" / "http_server.py"))
    for e in ENDPOINTS:
        assert routes.get(e.path) == set(e.methods), e.path
    assert "/weight_version" in routes  # the other name of /get_weight_version (404 in 0.5.10 and 0.5.14)


@pytest.mark.sglang  # reads SGLang's source: RELAX_SGLANG_SOURCE or an installed sglang
def test_sampling_params_and_their_null_defaults(sglang_dir: Path) -> None:
    init = _function(_module(sglang_dir / "srt" / "sampling" / "sampling_params.py"), "SamplingParams", "__init__")
    args = init.args.args[1:]
    defaults = [None] * (len(args) - len(init.args.defaults)) + list(init.args.defaults)
    assert {a.arg: _default(d) for a, d in zip(args, defaults, strict=True)} == SAMPLING_PARAMS
    # self.x = x if x is not None else <default>
    none_is_default = {st.value.test.left.id for st in ast.walk(init)
                       if isinstance(st, ast.Assign) and isinstance(st.value, ast.IfExp)
                       and isinstance(st.value.test, ast.Compare) and isinstance(st.value.test.ops[0], ast.IsNot)
                       and isinstance(st.value.test.left, ast.Name)}
    assert none_is_default == SAMPLING_NONE_IS_DEFAULT


@pytest.mark.sglang  # reads SGLang's source: RELAX_SGLANG_SOURCE or an installed sglang
def test_weights_checker_actions_and_checksum_shape(sglang_dir: Path) -> None:
    """The checker's actions, and the rank record our one-rank answer copies (``ParallelismInfo``)."""
    module = _module(sglang_dir / "srt" / "utils" / "weight_checker.py")
    handle = _function(module, "WeightChecker", "handle")
    actions = {c.comparators[0].value for c in ast.walk(handle) if isinstance(c, ast.Compare)
               and isinstance(c.left, ast.Name) and c.left.id == "action"}
    assert actions == set(WEIGHTS_CHECKER_ACTIONS)
    models = _dataclass_fields(module)
    assert set(models["ChecksumInfo"]) == {"checksums", "per_gpu_checksum", "parallelism_info"}
    assert set(models["ParallelismInfo"]) == set(ONE_RANK)
