"""JSON on the engine API's hot path, written the way SGLang's server writes it.

SGLang's HTTP server renders every answer with orjson (``sglang/srt/utils/json_response.py``:
non-string dict keys and numpy values allowed). Our server, router and client use the same encoder:
a rollout's ``/generate`` answer (token ids and log-prob triples for a whole batch) is encoded and
decoded several times per step, and the standard library's ``json`` takes ~10x longer on it
(ci/bench_json_codec.py). Like SGLang's, the encoder writes a non-finite float as ``null``;
`logprob` reads such an entry back as ``-inf``.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
JSONDecodeError = orjson.JSONDecodeError  # a ValueError (and json.JSONDecodeError's subclass)
CONTENT_TYPE = "application/json"


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=OPTIONS)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    return orjson.loads(data)


def json_response(obj: Any, status: int = 200) -> web.Response:
    """aiohttp's ``web.json_response`` with this encoder."""
    return web.Response(body=dumps(obj), status=status, content_type=CONTENT_TYPE)


def logprob(value: float | None) -> float:
    """One log-prob from an SGLang answer: ``null`` is a non-finite one the encoder could not write (-inf)."""
    return float("-inf") if value is None else float(value)
