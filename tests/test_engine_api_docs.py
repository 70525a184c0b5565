"""docs/engine_api.md's endpoint tables are generated from the code that serves them, and say what the
embedded engine does with every SGLang field."""

from __future__ import annotations

from pathlib import Path

from relax.engine import api_docs
from relax.engine.protocol import ENDPOINTS, SAMPLING_PARAMS

DOC = Path(__file__).resolve().parents[1] / "docs" / "engine_api.md"


def test_the_doc_is_current() -> None:
    doc = DOC.read_text()
    assert api_docs.splice(doc) == doc, "regenerate: python -m relax.engine.api_docs --write docs/engine_api.md"


def test_every_endpoint_and_field_is_listed() -> None:
    doc = DOC.read_text()
    for e in ENDPOINTS:
        assert f"| `{e.path}` |" in doc
        for name in e.fields:
            assert f"| `{name}` |" in doc
    for name in SAMPLING_PARAMS:
        assert f"| `{name}` |" in doc


def test_implemented_fields_are_real_sglang_fields() -> None:
    """What the engine claims to implement exists in SGLang's request (no invented field names)."""
    by_path = {e.path: e for e in ENDPOINTS}
    for path, fields in api_docs._implemented().items():
        assert fields <= set(by_path[path].fields), (path, fields - set(by_path[path].fields))
    from relax.backends.embedded.sampling import IMPLEMENTED

    assert IMPLEMENTED <= set(SAMPLING_PARAMS)
