#!/usr/bin/env bash
# Build the harness images from the repository root: relax:cpu and/or relax:gpu.
#   containers/build_images.sh cpu|gpu|all [--offline]
# --offline: build the Debian base with build_base.sh first and use it as BASE (no registry).
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT="${1:-cpu}"; OFFLINE="${2:-}"
args=()
if [ "$OFFLINE" = "--offline" ]; then
  docker image inspect relax-base:bookworm >/dev/null 2>&1 || containers/build_base.sh relax-base:bookworm
  args+=(--build-arg BASE=relax-base:bookworm)
fi
if [ "$WHAT" = cpu ] || [ "$WHAT" = all ]; then
  docker build --network host "${args[@]}" -f containers/Dockerfile.cpu -t relax:cpu .
fi
if [ "$WHAT" = gpu ] || [ "$WHAT" = all ]; then
  # the build machine's CA bundle goes in: its package registry may sit behind a TLS-intercepting proxy
  mkdir -p containers/.build && cp /etc/ssl/certs/ca-certificates.crt containers/.build/ca-certificates.crt
  docker build --network host "${args[@]}" -f containers/Dockerfile.gpu -t relax:gpu .
fi
