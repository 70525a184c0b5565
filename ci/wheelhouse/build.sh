#!/usr/bin/env bash
# Build the cp312 wheelhouse the air-gapped GPU machine lacks (ray, megatron-core and their
# missing deps), small enough to travel with the working tree in one device call (64 MiB in all).
#
#   ci/wheelhouse/build.sh [OUT_ROOT]      (default OUT_ROOT=.)
#
# Produces OUT_ROOT/.whl (~47 MiB: ray repacked without its Java jars, dashboard web client and rllib by
# ci/wheelhouse/repack.py, 79 -> 43 MB); a wheel still over 40 MiB is split into chunks, the first in .whl
# and the rest in OUT_ROOT/.whl2 (empty today). Both are git-ignored. On the GPU machine,
# ci/wheelhouse/install.sh reassembles and installs.
# Also OUT_ROOT/.whl4 (git-ignored, ~2 MB, no chunks): TRL and the datasets wheels it lacks there, for the
# TRL row of ci/bench_grpo_e2e.py (MACHINES.md: these suffice there, pyarrow, fsspec and accelerate are installed);
# ci/gpu_session.sh installs them into their own --target dir for its `grpo` item. OUT_ROOT/.whl5: Ray's dashboard.
set -euo pipefail
OUT_ROOT="${1:-.}"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# pydantic and its deps, orjson: the GPU image lacks them (the device tool's KINDS.md package list), relax needs them.
WHEELS=(ray==2.60.0 megatron-core==0.19.2 jsonschema jsonschema-specifications referencing rpds-py
        pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 orjson==3.13.0)
# Ray's dashboard, which serves `ray job submit` (ray/dashboard/optional_deps.py imports these; the image has aiohttp,
# grpcio, prometheus-client, protobuf and six): ~2 MB in OUT_ROOT/.whl5, installed into a --target dir of its own
# (ci/gpu_session.sh's two_nodes item): with them Ray runs its full dashboard agent, which only that test needs.
DASHBOARD_WHEELS=(aiohttp-cors==0.8.1 opencensus==0.11.4 opencensus-context==0.1.3 opentelemetry-api==1.45.2
                  opentelemetry-sdk==1.45.2 opentelemetry-exporter-prometheus==0.66b2 opentelemetry-proto==1.45.2
                  opentelemetry-semantic-conventions==0.66b2 importlib-metadata==10.2.0 googleapis-common-protos==1.76.0)
TRL_WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)  # datasets 5.2: dill<0.4.2, multiprocess<0.70.20
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$STAGE" "${WHEELS[@]}" ${EXTRA_WHEELS:-}
# ray: nothing of relax starts a Java worker, the dashboard's web UI or RLlib (see repack.py)
for w in "$STAGE"/ray-*.whl; do
  mkdir -p "$STAGE/repacked"
  python3 "$(dirname "$0")/repack.py" "$w" "$STAGE/repacked" --drop ray/jars/ --drop ray/dashboard/client/build/ \
    --drop ray/rllib/
  mv "$STAGE/repacked/$(basename "$w")" "$w"
done
rm -rf "$OUT_ROOT/.whl" "$OUT_ROOT/.whl2"
mkdir -p "$OUT_ROOT/.whl" "$OUT_ROOT/.whl2"
for w in "$STAGE"/*.whl; do
  size=$(stat -c %s "$w")
  if [ "$size" -gt $((48 * 1024 * 1024)) ]; then
    name=$(basename "$w")
    split -b 40m -d "$w" "$STAGE/$name.part"
    first=1
    for part in "$STAGE/$name.part"*; do
      if [ $first = 1 ]; then mv "$part" "$OUT_ROOT/.whl/"; first=0; else mv "$part" "$OUT_ROOT/.whl2/"; fi
    done
  else
    mv "$w" "$OUT_ROOT/.whl/"
  fi
done
rm -rf "$OUT_ROOT/.whl4"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$OUT_ROOT/.whl4" "${TRL_WHEELS[@]}"
rm -rf "$OUT_ROOT/.whl5"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$OUT_ROOT/.whl5" "${DASHBOARD_WHEELS[@]}"
du -sh "$OUT_ROOT/.whl" "$OUT_ROOT/.whl2" "$OUT_ROOT/.whl4" "$OUT_ROOT/.whl5"
