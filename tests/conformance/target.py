"""The server a conformance check talks to: a live SGLang server (``RELAX_CONFORMANCE_URL``) or, by default,
the embedded engine started here on CPU over the same tiny Qwen3 checkpoint the GPU session gives SGLang
(``ci/wheelhouse/sglang_smoke.py``'s ``write_model``)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

URL_ENV, MODEL_ENV, JSON_ENV = "RELAX_CONFORMANCE_URL", "RELAX_CONFORMANCE_MODEL_DIR", "RELAX_CONFORMANCE_JSON"


@dataclass(frozen=True)
class Target:
    url: str
    live: bool  # a real SGLang server; False: the embedded engine
    model_dir: Path  # the HF checkpoint it serves (update_weights_from_disk reloads it)

    @property
    def name(self) -> str:
        return "sglang" if self.live else "embedded"

    def call(self, method: str, path: str, body: Any = None, *, timeout: float = 120.0) -> tuple[int, Any]:
        """(status, body): JSON decoded where it is JSON, else the text ('' for an empty body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text) if text.strip() else ""
        except json.JSONDecodeError:
            return status, text

    def hf_state(self) -> list[tuple[str, Any]]:
        """The checkpoint's tensors by HF name, as on disk."""
        from relax.weights.hf_files import read_hf_dir

        return read_hf_dir(self.model_dir)


def write_tiny_model(path: Path) -> Path:
    """The GPU session's tiny random-init Qwen3 (bf16, relax's character tokenizer)."""
    from ci.wheelhouse.sglang_smoke import write_model

    if not (path / "config.json").exists():
        write_model(path)
    return path


def live_target() -> Target | None:
    url = os.environ.get(URL_ENV)
    if not url:
        return None
    model_dir = os.environ.get(MODEL_ENV)
    if not model_dir:
        raise RuntimeError(f"{URL_ENV} is set: {MODEL_ENV} must name the HF checkpoint that server serves")
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    return Target(f"{parsed.scheme}://{parsed.netloc}", True, Path(model_dir))


def endpoints(*paths: str):
    """Tag a check with the endpoints it exercises (the JSON report's keys)."""
    def tag(fn):
        fn.conformance_endpoints = paths
        return fn
    return tag
