#!/usr/bin/env bash
# Build megatron-bridge 0.6.2's wheelhouse for the air-gapped GPU machine (--megatron-to-hf-mode bridge), in loads
# that each fit one device call.
#
#   ci/wheelhouse/build_bridge.sh [OUT_ROOT]        (default OUT_ROOT=.)
#
# 1. Downloads every wheel of ci/wheelhouse/bridge.lock (bridge_closure.py: megatron-bridge, transformers 5.12.1,
#    tokenizers 0.22.2, omegaconf 2.4.0; 16.9 MB) with pip's hash checking (fetch_lock.sh).
# 2. Repacks megatron-bridge with its one source edit (bridge_closure.py PATCHES: Transformer Engine optional in
#    peft/lora_layers.py), the same name and every other file byte for byte.
# 3. Packs them into OUT_ROOT/.bridge/load1..N (one load today), each at most BRIDGE_LOAD_MIB (default 54), with
#    manifest.json (wheel_loads.py). OUT_ROOT/.bridge is git-ignored. Ship load i in call i (carry .bridge/load<i>,
#    BRIDGE_LOAD=i bash ci/gpu_session.sh - bridge_stage); install_bridge.sh stages, checks and installs it into
#    /tmp/bridgesite on the GPU machine.
set -euo pipefail
OUT_ROOT="${1:-.}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${BRIDGE_PYTHON:-python3}"  # any interpreter with pip: --python-version/--platform pick the GPU machine's wheels
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
PY="$PY" bash "$HERE/fetch_lock.sh" "$HERE/bridge.lock" "$STAGE/dl"
mkdir -p "$STAGE/wheels"
for w in "$STAGE"/dl/*.whl; do
  case "$(basename "$w")" in
    megatron_bridge-0.6.2-*) "$PY" "$HERE/bridge_closure.py" patch "$w" "$STAGE/wheels" ;;
    *) mv "$w" "$STAGE/wheels/" ;;
  esac
done
"$PY" "$HERE/wheel_loads.py" pack "$STAGE/wheels" "$OUT_ROOT/.bridge" --load-mib "${BRIDGE_LOAD_MIB:-54}" --chunk-mib 40
du -sh "$OUT_ROOT"/.bridge/load*
