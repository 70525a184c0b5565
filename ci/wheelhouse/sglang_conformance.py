"""Run tests/conformance against a real SGLang 0.5.14 server on the GPU (issue 39 run 6).

    python3 ci/wheelhouse/sglang_conformance.py --out $OUT [--port 30000] [--startup-timeout 420]

Writes sglang_smoke's tiny random-init Qwen3, starts ``python3 -m sglang.launch_server`` (PYTHONPATH=--site) with
the smoke's flags plus ``--enable-memory-saver`` (release / resume occupation), waits for ``/health_generate``
(bounded), runs ``pytest tests/conformance`` with RELAX_CONFORMANCE_URL / _MODEL_DIR / _JSON (JUnit
``$OUT/sglang_conformance.xml``, endpoint report ``$OUT/sglang_conformance.json``) and stops the server by its
process group in every path (a failed start, a pytest crash, SIGTERM from ``timeout``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_smoke import REPO, http, write_model  # noqa: E402


def server_cmd(args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(args.model_dir),
            "--tokenizer-path", str(args.model_dir), "--host", "127.0.0.1", "--port", str(args.port),
            "--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
            "--mem-fraction-static", "0.3", "--cuda-graph-max-bs-decode", "8", "--context-length", "1024",
            "--dtype", "bfloat16", "--log-level", "info", "--enable-memory-saver",
            "--disable-prefill-cuda-graph"]  # piecewise prefill graphs compile for minutes and prove no protocol


def wait_healthy(server: subprocess.Popen, base: str, timeout: float) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with {server.returncode} before it was healthy")
        try:
            if http(f"{base}/health_generate", timeout=20)[0] == 200:
                return time.time() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    raise RuntimeError(f"not healthy after {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default=os.environ.get("SGL_SITE", "/tmp/sglsite"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/sgl_tiny_qwen3"))
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--startup-timeout", type=float, default=420.0)
    parser.add_argument("--pytest-timeout", type=float, default=300.0)
    parser.add_argument("--test-timeout", type=int, default=45, help="seconds per check (pytest-timeout, if installed)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.model_dir / "config.json").exists():
        write_model(args.model_dir)
    base = f"http://127.0.0.1:{args.port}"
    env = {**os.environ, "PYTHONPATH": args.site, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    log_path = args.out / "sglang_conformance_server.log"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` still reaches the finally below
    print("sglang_conformance:", " ".join(server_cmd(args)), flush=True)
    with log_path.open("w") as log:
        server = subprocess.Popen(server_cmd(args), env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        print(f"sglang_conformance: healthy after {wait_healthy(server, base, args.startup_timeout):.0f} s", flush=True)
        test_env = {**os.environ, "PYTHONPATH": f"{REPO}:{args.site}", "RELAX_CONFORMANCE_URL": base,
                    "RELAX_CONFORMANCE_MODEL_DIR": str(args.model_dir),
                    "RELAX_CONFORMANCE_JSON": str(args.out / "sglang_conformance.json")}
        cmd = [sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "tests/conformance",
               "--junitxml", str(args.out / "sglang_conformance.xml")]
        if importlib.util.find_spec("pytest_timeout"):  # one hung check fails alone instead of the whole suite
            cmd += ["--timeout", str(args.test_timeout)]
        return subprocess.run(cmd, cwd=REPO, env=test_env, timeout=args.pytest_timeout).returncode
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"sglang_conformance: {exc}", flush=True)
        return 1
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    sys.exit(main())
