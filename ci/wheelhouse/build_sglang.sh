#!/usr/bin/env bash
# Build sglang 0.5.14's wheelhouse for the air-gapped GPU machine, cut into loads that each fit one device call.
#
#   ci/wheelhouse/build_sglang.sh [OUT_ROOT]        (default OUT_ROOT=.)
#
# 1. Downloads every wheel of ci/wheelhouse/sglang.lock (written by sglang_closure.py: the closure minus what the
#    machine has, and minus the optional pieces it lists) with pip's hash checking, so each file is the one pinned.
# 2. Repacks sglang-kernel 0.4.4 (615 MB -> ~16 MB) with ci/wheelhouse/repack.py, dropping what a Hopper GPU serving
#    with --attention-backend flashinfer (or triton) never loads:
#    - sgl_kernel/flash_ops.abi3.so (FA3, 1.76 GB unpacked). sgl_kernel/__init__.py never imports it; only
#      sgl_kernel/flash_attn.py does, and that module raises ImportError without it ("Can not import FA3"). sglang
#      imports sgl_kernel.flash_attn only inside FlashAttentionBackend.__init__ for fa_impl_ver=3 (the `fa3`
#      backend), in the XPU backend, in vision attention on XPU, and in two audio models (mimo). sglang picks fa3 by
#      default for MHA models on Hopper (server_args.py), so the server MUST be started with
#      --attention-backend flashinfer or triton: then no code path imports flash_attn and the missing .so is never
#      asked for. Asking for fa3 anyway fails loudly at backend construction, not silently.
#    - sgl_kernel/sm100/ (common_ops for Blackwell and for "any other capability"). load_utils.py picks
#      sm90/common_ops for compute capability 9.0 exactly (H100/H200) and sm100/ otherwise; a non-Hopper GPU
#      therefore fails at `import sgl_kernel` with "[sgl_kernel] CRITICAL: Could not load any common_ops library".
#    - sgl_kernel/flashmla_ops.abi3.so (FlashMLA, DeepSeek-style MLA): sgl_kernel/flash_mla.py imports it under
#      try/except and raises only when its functions are called.
#    Kept: sm90/common_ops (20 MB: norms, activations, rope, sampling helpers, MoE, ...), spatial_ops (85 kB, green
#    contexts) and the pure-Python triton_kernels package.
#    The other wheels over 40 MB in sglang's closure are left out whole (sglang_closure.py EXCLUDED, with reasons):
#    flashinfer_cubin (447 MB, flashinfer JIT-compiles with nvcc instead), nvidia-cutlass-dsl's libs (2 x ~77 MB),
#    xgrammar (45 MB, the server runs with --grammar-backend none) and tilelang (43 MB, DeepSeek sparse attention).
#    flashinfer_python (14 MB) is carried whole: its data/ holds the sources and headers its JIT compiles.
# 3. Splits any wheel over 40 MiB into chunks (none today) and packs everything into OUT_ROOT/.sgl/load1..N, each at
#    most SGL_LOAD_MIB (default 54: a call carries 64 MiB, the working tree ~7 MiB of it), with manifest.json
#    (ci/wheelhouse/wheel_loads.py). OUT_ROOT/.sgl is git-ignored. Ship load i in call i (carry .sgl/load<i>);
#    ci/wheelhouse/install_sglang.sh stages, checks and installs on the GPU machine.
set -euo pipefail
OUT_ROOT="${1:-.}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${SGL_PYTHON:-python3}"  # any interpreter with pip: --python-version/--platform pick the GPU machine's wheels
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
PY="$PY" bash "$HERE/fetch_lock.sh" "$HERE/sglang.lock" "$STAGE/dl"
mkdir -p "$STAGE/wheels"
for w in "$STAGE"/dl/*.whl; do
  case "$(basename "$w")" in
    sglang_kernel-0.4.4-*) "$PY" "$HERE/repack.py" "$w" "$STAGE/wheels" --drop sgl_kernel/flash_ops.abi3.so \
                             --drop sgl_kernel/sm100/ --drop sgl_kernel/flashmla_ops.abi3.so ;;
    *) mv "$w" "$STAGE/wheels/" ;;
  esac
done
"$PY" "$HERE/wheel_loads.py" pack "$STAGE/wheels" "$OUT_ROOT/.sgl" --load-mib "${SGL_LOAD_MIB:-54}" --chunk-mib 40
du -sh "$OUT_ROOT"/.sgl/load*
