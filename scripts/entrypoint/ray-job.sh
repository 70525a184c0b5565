#!/bin/bash
# Multi-node launch, Ray Job mode (seed 001): the Ray cluster is already running, managed elsewhere
# (KubeRay, a platform, or spmd-multinode.sh); this script neither starts nor stops Ray. Run it on a node
# of the cluster (or submit it with ray job submit, which sets RAY_ADDRESS): relax joins the cluster named
# by RAY_ADDRESS, else the one ray start runs on this machine (auto).
#
#   bash scripts/entrypoint/ray-job.sh --resource '{"actor": [1, 16], "rollout": [1, 16]}' --colocate \
#       --num-gpus-per-node 8 ...
#
# RELAX_DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

REPO="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." &>/dev/null && pwd)"
show() { printf '%q ' "$@"; printf '\n'; }
export RELAX_ENTRYPOINT_MODE=ray-job
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
${RELAX_DRY_RUN:+show} python3 "${REPO}/relax/entrypoints/train.py" "$@"
