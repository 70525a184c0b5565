"""Start sglang 0.5.14 from the carried wheelhouse on a tiny random-init Qwen3 and ask it once.

    python3 ci/wheelhouse/sglang_smoke.py [--site /tmp/sglsite] [--port 30000] [--json OUT.json]

Run on the GPU machine after ci/wheelhouse/install_sglang.sh. It writes a Qwen3 of ~1M parameters (bf16) with
relax's offline character tokenizer (ChatML template) to --model-dir, starts ``python3 -m sglang.launch_server``
with PYTHONPATH=--site first and the flags an air-gapped Hopper machine with this wheelhouse needs, waits for
``GET /health_generate``, sends one ``POST /generate`` and stops the server. Flags:

* ``--attention-backend`` (default triton; flashinfer also works): never the Hopper default ``fa3``, whose
  library (sgl_kernel/flash_ops) the repacked sglang-kernel leaves out. triton compiles in seconds; flashinfer
  JIT-compiles its kernels with nvcc on first use (minutes, cached under ~/.cache/flashinfer).
* ``--sampling-backend pytorch``: no flashinfer JIT for sampling on a smoke run.
* ``--grammar-backend none``: xgrammar is not carried.
* local ``--model-path``/``--tokenizer-path``, HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1: nothing is fetched.
* ``--mem-fraction-static 0.3 --cuda-graph-max-bs-decode 8 --context-length 1024``: small, quick to capture.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def write_model(path: Path) -> None:
    import torch
    import transformers as tf

    sys.path.insert(0, str(REPO))
    from relax.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    cfg = tf.Qwen3Config(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                         tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    model = tf.Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)


def http(url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default=os.environ.get("SGL_SITE", "/tmp/sglsite"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/sgl_tiny_qwen3"))
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--attention-backend", default="triton", choices=["triton", "flashinfer"])
    parser.add_argument("--startup-timeout", type=float, default=420.0)
    parser.add_argument("--log", type=Path, default=Path("/tmp/sglang_smoke_server.log"))
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    if not (args.model_dir / "config.json").exists():
        write_model(args.model_dir)
    env = {**os.environ, "PYTHONPATH": args.site, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(args.model_dir),
           "--tokenizer-path", str(args.model_dir), "--host", "127.0.0.1", "--port", str(args.port),
           "--attention-backend", args.attention_backend, "--sampling-backend", "pytorch",
           "--grammar-backend", "none", "--mem-fraction-static", "0.3", "--cuda-graph-max-bs-decode", "8",
           "--context-length", "1024", "--dtype", "bfloat16", "--log-level", "info"]
    print("sglang_smoke:", " ".join(cmd), flush=True)
    t0 = time.time()
    result: dict = {"cmd": cmd, "attention_backend": args.attention_backend}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` still stops the server (finally)
    with args.log.open("w") as log:
        server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{args.port}"
    try:
        while time.time() - t0 < args.startup_timeout:
            if server.poll() is not None:
                raise RuntimeError(f"server exited with {server.returncode} before it was healthy")
            try:
                status, _ = http(f"{base}/health_generate", timeout=20)
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        else:
            raise RuntimeError(f"not healthy after {args.startup_timeout:.0f} s")
        result["healthy_after_s"] = round(time.time() - t0, 1)
        status, body = http(f"{base}/generate", {"text": "1+2=", "sampling_params":
                                                  {"max_new_tokens": 16, "temperature": 0.0}}, timeout=120)
        result["generate_status"], result["generate"] = status, json.loads(body) if status == 200 else body
        result["ok"] = status == 200
    except RuntimeError as e:
        result["ok"], result["error"] = False, str(e)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    if not result["ok"]:
        result["server_log_tail"] = args.log.read_text()[-4000:]
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
