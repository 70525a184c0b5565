"""Resolve sglang 0.5.14's runtime closure for the GPU machine and write ci/wheelhouse/sglang.lock.

    ~/.pyenv/versions/3.12.1/bin/python ci/wheelhouse/sglang_closure.py --cache /tmp/sglcache [--lock PATH]

Starting from ``sglang==0.5.14`` it downloads each wheel (cp312, manylinux x86_64, ``--no-deps``), reads its
``Requires-Dist`` and evaluates the markers for the GPU machine (Linux, x86_64, CPython 3.12), with the extras a
requirement names (``flashinfer_python[cu13]``) and no others, and recurses. It stops at:

* what the GPU machine already has (gpu_machine_packages.txt), unless a requirement excludes the version known
  there: then the required version is carried (``transformers==5.8.1``: sglang pins it, the machine has 5.17.0;
  it lands in sglang's own --target dir, first on PYTHONPATH, so relax's environment keeps 5.17.0);
* EXCLUDED below: what `python -m sglang.launch_server` never loads for a text Qwen3 model on Hopper with
  ``--attention-backend flashinfer`` (or triton) and the flags ci/gpu_session.sh's sglang_smoke passes. Each
  carries its reason; each was checked against sglang's import graph: with the lock installed by
  ``pip install --no-index --no-deps --target`` on the CPU box, ``sglang.launch_server``,
  ``sglang.srt.entrypoints.http_server``, the scheduler, model runner, Qwen3 and the triton/flashinfer attention
  backends import, and ci/wheelhouse/import_sweep.py sglang.srt finds only excluded features' modules missing.

Unpinned requirements get the newest release that satisfies every specifier met in the closure; the lock pins
exactly that file by its sha256, so ``pip download --require-hashes -r sglang.lock`` fetches the same bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from closure import HERE, Closure, Requirement, machine_packages, main, norm, wanted  # noqa: E402, F401

ROOTS = ["sglang==0.5.14"]
# Imported at module level on the server's path but not declared by sglang 0.5.14 (they arrive there through
# datasets and outlines, both left out below): found by importing every sglang.srt module on the CPU box.
UNDECLARED = {
    "dill": "sglang/srt/sampling/custom_logit_processor.py (reached from sglang.launch_server)",
    "jsonschema": "sglang/srt/entrypoints/openai/serving_chat.py (reached from entrypoints/http_server.py)",
}
# name -> why `sglang.launch_server` serving a text Qwen3 model on an H200 (flashinfer or triton attention,
# no speculative decoding, no multimodal, no grammar backend other than xgrammar) never needs it. Their own
# dependencies are not followed either.
EXCLUDED: dict[str, str] = {
    # -- GPU kernels Hopper + flashinfer/triton attention never load --
    "flashinfer-cubin": "447 MB of prebuilt cubins; flashinfer_python JIT-compiles the kernels it needs with the "
                        "machine's nvcc 13.0 when the cubin package is absent (flashinfer/jit)",
    "nvidia-cutlass-dsl": "CuTe DSL (153 MB with its -libs-base and -libs-cu13): flashinfer imports it under "
                          "contextlib.suppress/try (its CuTe-DSL MoE, fp4 norms: Blackwell paths), sglang only in "
                          "layers/attention/cute_utils and the Blackwell GDN/KDA kernels, none on a dense Qwen3 "
                          "forward with flashinfer attention",
    "flash-attn-4": "FA4 (--attention-backend fa4, Blackwell); loaded lazily by flashattention_backend only for "
                    "fa_impl_ver=4; it needs nvidia-cutlass-dsl",
    "quack-kernels": "CuTe-DSL kernels for the Blackwell GDN/KDA linear attention (layers/attention/linear/"
                     "kernels/*_blackwell); needs nvidia-cutlass-dsl>=4.7, which sglang's ==4.5.2 pin excludes",
    "tokenspeed-mla": "MLA decode kernels (DeepSeek-style models), imported inside a function; needs cutlass-dsl",
    "tilelang": "43 MB; DeepSeek DSA/V4 sparse-attention kernels (layers/attention/dsa, dsv4) only",
    "sgl-deep-gemm": "DeepGEMM fp8 block GEMMs (fp8 checkpoints); every import sits in a function or a guard",
    "nvidia-mathdx": "23 MB of cuBLASDx headers for the EP load balancer's JIT solver (jit_kernel/lplb) only",
    "cuda-tile": "cuTile for flashinfer's all-gather-matmul (comm/all_gather_matmul); its [tileiras] extra wants "
                 "cuda-toolkit[nvcc,nvvm]>=13.2 while the machine's torch is built on the installed CUDA 13.0",
    "nvidia-cudnn-frontend": "cuDNN attention backends of flashinfer (cudnn_batch_prefill/decode), imported "
                             "inside those functions; its newest release also wants cutlass-dsl>=4.8",
    # -- optional frontends and services --
    "xgrammar": "45 MB; the default grammar backend, built only by constrained/base_grammar_backend.py's "
                "create_grammar_backend when --grammar-backend is xgrammar; the server runs with --grammar-backend "
                "none (RL rollouts use no structured output), and the two other imports (openai/protocol.py, "
                "function_call/base_format_detector.py) are under try/except. Carrying it would take a third load",
    "outlines": "the outlines grammar backend (--grammar-backend outlines), imported only when chosen; it brings "
                "outlines_core, pycountry (8 MB), airportsdata, lark, diskcache, jsonschema",
    "datasets": "sglang's benchmarks only (bench_serving); sglang.srt imports it nowhere",
    "blobfile": "the Azure blob model connector (connector/azure.py, imported inside a function); brings "
                "pycryptodomex",
    "llguidance": "15 MB; the llguidance grammar backend (--grammar-backend llguidance), imported only by "
                  "constrained/llguidance_backend.py when chosen",
    "mistral-common": "Mistral tokenizers (imported inside a function); it caps numpy<2.4 on Python 3.12, which "
                      "would shadow the machine's numpy 2.5.2 with 2.3.5 under PYTHONPATH",
    "modelscope": "downloads from ModelScope (SGLANG_USE_MODELSCOPE); nothing is downloaded on an air-gapped host",
    "anthropic": "sglang.lang's Anthropic backend, a LazyImport in sglang/__init__.py guarded by try/except; "
                 "sglang.srt imports it nowhere",
    "py-spy": "a command-line profiler that utils/cudacore_pyspy_dump_utils.py runs (as `py-spy dump`) to dump "
              "the schedulers' stacks when a request hangs; a debugging aid, not serving",
    "torchcodec": "audio/video decoding for multimodal processors; the processor registry imports them under "
                  "try/except (mimo_v2 logs 'torchcodec is not installed') and it needs FFmpeg's shared libraries",
    "kernels": "Hugging Face kernel hub downloads (network); sglang.srt imports it nowhere",
    "smg-grpc-servicer": "the gRPC serving mode (--grpc-mode); imported inside a function",
}

SPEC = Closure("sglang 0.5.14", "sglang_closure.py", "build_sglang.sh", ROOTS, UNDECLARED, EXCLUDED)

if __name__ == "__main__":
    main(SPEC, HERE / "sglang.lock", __doc__.splitlines()[0])
