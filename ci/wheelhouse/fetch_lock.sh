#!/usr/bin/env bash
# Download every wheel a lock pins (cp312, manylinux x86_64: the GPU machine's) with pip's hash checking, so each
# file is the one pinned, and check that pip saved one wheel per pin.
#
#   ci/wheelhouse/fetch_lock.sh LOCK DEST_DIR        (PY: any interpreter with pip, default python3)
#
# build_sglang.sh and build_bridge.sh start with it.
set -euo pipefail
LOCK="${1:?usage: fetch_lock.sh LOCK DEST_DIR}"
DEST="${2:?usage: fetch_lock.sh LOCK DEST_DIR}"
PY="${PY:-python3}"
PLATFORMS=()
for n in $(seq 39 -1 17); do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform linux_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" --require-hashes -r "$LOCK" -d "$DEST"
want=$(grep -c '^[A-Za-z0-9]' "$LOCK")
got=$(ls "$DEST"/*.whl | wc -l)
[ "$want" = "$got" ] || { echo "fetch_lock: $LOCK pins $want wheels, pip saved $got" >&2; exit 1; }
