"""A stand-in for ``python -m sglang.launch_server`` in CPU tests of the bench's SGLang paths (ci/bench_sglang.py).

    python tests/fake_sglang_server.py --port N [--mode ok|exit|never-ready|short] [--pid-file F]

It answers ``GET /health_generate`` and ``POST /generate`` (one SGLang request, or a batched one with lists of
``input_ids`` / ``sampling_params``) with SGLang's response shape: ``max_new_tokens`` output ids (one fewer in
``short`` mode), ``meta_info`` with ``output_token_logprobs`` ([logprob, id, None]) and ``e2e_latency``. ``exit``
exits with status 3 at once; ``never-ready`` serves nothing. ``--pid-file``: its pid, for the test to check it ended.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer(input_ids: list[int], params: dict, short: bool) -> dict:
    new = int(params.get("max_new_tokens", 16)) - (1 if short else 0)
    ids = [(sum(input_ids) + 7 * i) % 50 + 3 for i in range(new)]
    return {"text": "", "output_ids": ids,
            "meta_info": {"id": "x", "prompt_tokens": len(input_ids), "completion_tokens": new,
                          "finish_reason": {"type": "length", "length": new}, "e2e_latency": 0.001,
                          "output_token_logprobs": [[-math.log(64), t, None] for t in ids]}}


def send_json(handler: BaseHTTPRequestHandler, status: int, body: object) -> None:
    """Answer ``handler``'s request with ``body`` as JSON (shared by the test servers built on http.server)."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok", choices=["ok", "exit", "never-ready", "short"])
    ap.add_argument("--pid-file", default=None)
    ns, _ = ap.parse_known_args()
    if ns.pid_file:
        with open(ns.pid_file, "w") as fh:
            fh.write(str(os.getpid()))
    if ns.mode == "exit":
        print("fake sglang: RuntimeError: no GPU here", flush=True)
        sys.exit(3)
    if ns.mode == "never-ready":
        while True:
            time.sleep(1)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: object) -> None:
            send_json(self, status, body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._send(200 if self.path in ("/health", "/health_generate") else 404, {})

        def do_POST(self) -> None:  # noqa: N802
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/generate":
                return self._send(404, {"error": self.path})
            short = ns.mode == "short"
            if req["input_ids"] and isinstance(req["input_ids"][0], list):
                params = req["sampling_params"]
                params = params if isinstance(params, list) else [params] * len(req["input_ids"])
                return self._send(200, [answer(i, p, short) for i, p in zip(req["input_ids"], params, strict=True)])
            return self._send(200, answer(req["input_ids"], req["sampling_params"], short))

    ThreadingHTTPServer(("127.0.0.1", ns.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
