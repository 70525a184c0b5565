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
  backends import, and ci/wheelhouse/sglang_import_sweep.py finds only excluded features' modules missing.

Unpinned requirements get the newest release that satisfies every specifier met in the closure; the lock pins
exactly that file by its sha256, so ``pip download --require-hashes -r sglang.lock`` fetches the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:  # pip always vendors it
    from pip._vendor.packaging.markers import Marker  # noqa: F401
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version

HERE = Path(__file__).resolve().parent
ROOTS = ["sglang==0.5.14"]
# Imported at module level on the server's path but not declared by sglang 0.5.14 (they arrive there through
# datasets and outlines, both left out below): found by importing every sglang.srt module on the CPU box.
UNDECLARED = {
    "dill": "sglang/srt/sampling/custom_logit_processor.py (reached from sglang.launch_server)",
    "jsonschema": "sglang/srt/entrypoints/openai/serving_chat.py (reached from entrypoints/http_server.py)",
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]
MARKER_ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "",
    "platform_version": "",
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


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def machine_packages(path: Path) -> dict[str, Version | None]:
    out: dict[str, Version | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, *ver = line.split()
            out[norm(name)] = Version(ver[0]) if ver else None
    return out


@dataclass
class Pick:
    name: str
    version: str
    wheel: Path
    requires: list[Requirement]
    extras: set[str] = field(default_factory=set)
    parents: set[str] = field(default_factory=set)


def download(req: str, cache: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d", str(cache), req]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"closure: pip download {req} failed:\n{out.stderr[-2000:]}")
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(?:Saved|File was already downloaded) (\S+\.whl)", line)
        if m:
            return Path(m.group(1))
    raise SystemExit(f"closure: pip download {req} saved no wheel:\n{out.stdout[-2000:]}")


def metadata(wheel: Path) -> tuple[str, str, list[Requirement]]:
    with zipfile.ZipFile(wheel) as z:
        meta = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        msg = Parser().parsestr(z.read(meta[0]).decode())
    return msg["Name"], msg["Version"], [Requirement(r) for r in msg.get_all("Requires-Dist") or []]


def wanted(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in (extras or {""}) | {""})


def resolve(cache: Path, machine: dict[str, Version | None]) -> tuple[dict[str, Pick], dict[str, list[str]]]:
    picks: dict[str, Pick] = {}
    for _ in range(10):  # passes until no pick changes
        specs: dict[str, SpecifierSet] = {}
        extras: dict[str, set[str]] = {}
        parents: dict[str, set[str]] = {}
        on_machine: dict[str, list[str]] = {}
        queue = [(Requirement(r), "<root>") for r in ROOTS] + [(Requirement(r), "<undeclared>") for r in UNDECLARED]
        seen: set[str] = set()
        changed = False
        while queue:
            req, parent = queue.pop(0)
            key = norm(req.name)
            if key in EXCLUDED:
                continue
            have = machine.get(key, False)
            if have is not False and (have is None or req.specifier.contains(have, prereleases=True)):
                on_machine.setdefault(key, []).append(f"{req.specifier or 'any'} (from {parent})")
                continue
            specs[key] = specs.get(key, SpecifierSet()) & req.specifier
            extras.setdefault(key, set()).update(req.extras)
            parents.setdefault(key, set()).add(parent)
            pick = picks.get(key)
            if pick is None or not specs[key].contains(pick.version, prereleases=True):
                wheel = download(f"{req.name}{specs[key]}", cache)
                name, version, requires = metadata(wheel)
                picks[key] = pick = Pick(name, version, wheel, requires)
                changed = True
            state = (key, tuple(sorted(extras[key])))
            if state in seen:
                continue
            seen.add(state)
            queue += [(r, pick.name) for r in pick.requires if wanted(r, extras[key])]
        picks = {k: v for k, v in picks.items() if k in specs}
        for k, p in picks.items():
            p.extras, p.parents = extras[k], parents[k]
        if not changed:
            return picks, on_machine
    raise SystemExit("closure: no fixed point after 10 passes")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_lock(path: Path, picks: dict[str, Pick], on_machine: dict[str, list[str]],
               machine: dict[str, Version | None]) -> None:
    total = sum(p.wheel.stat().st_size for p in picks.values())
    lines = [
        "# sglang 0.5.14 for the GPU machine: every wheel it lacks there, pinned by file hash.",
        "# Written by ci/wheelhouse/sglang_closure.py; fetched by ci/wheelhouse/build_sglang.sh with",
        "#   pip download --no-deps --require-hashes -r ci/wheelhouse/sglang.lock",
        f"# {len(picks)} wheels, {total / 1e6:.1f} MB before repacking.",
        "#",
        "# Added: imported by sglang but not declared (sglang_closure.py UNDECLARED):",
        *[f"#   {k}: {why}" for k, why in sorted(UNDECLARED.items())],
        "#",
        "# Left out on purpose (sglang_closure.py EXCLUDED; their own dependencies are not followed):",
        *[f"#   {k}: {why}" for k, why in sorted(EXCLUDED.items())],
        "#",
        "# Taken from the GPU machine (gpu_machine_packages.txt); '?' = version not read there, assumed to fit:",
        *[f"#   {k} {machine[k] or '?'}: {'; '.join(sorted(set(v)))}" for k, v in sorted(on_machine.items())],
        "",
    ]
    for key in sorted(picks):
        p = picks[key]
        lines.append(f"# {p.wheel.name} ({p.wheel.stat().st_size / 1e6:.1f} MB) <- {', '.join(sorted(p.parents))}")
        lines.append(f"{p.name}=={p.version} --hash=sha256:{sha256(p.wheel)}")
    path.write_text("\n".join(lines) + "\n")
    print(f"closure: {len(picks)} wheels, {total / 1e6:.1f} MB -> {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="where the downloaded wheels are kept")
    parser.add_argument("--lock", type=Path, default=HERE / "sglang.lock")
    parser.add_argument("--machine", type=Path, default=HERE / "gpu_machine_packages.txt")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    machine = machine_packages(args.machine)
    picks, on_machine = resolve(args.cache, machine)
    write_lock(args.lock, picks, on_machine, machine)


if __name__ == "__main__":
    main()
