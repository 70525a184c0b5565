#!/bin/bash
# Multi-node launch, SPMD mode (seed 001): run the same command on every node; the node whose POD_NAME is
# MASTER_ADDR starts the Ray head, waits for the other WORLD_SIZE - 1 nodes to join and submits the run
# with ray job submit (needs ray[default] on the head); every other node joins the head and blocks until it
# goes away. relax must be importable on every node (the same checkout and venv, or pip install).
#
#   MASTER_ADDR=node-0 POD_NAME=$(hostname) HOST_IP=<this node's ip> WORLD_SIZE=2 NUM_GPUS=8 \
#     bash scripts/entrypoint/spmd-multinode.sh --resource '{"actor": [1, 16], "rollout": [1, 16]}' --colocate ...
#
# The arguments are relax train flags; the script adds --num-gpus-per-node NUM_GPUS, so each role's GPUs
# are reserved node by node. Environment: MASTER_ADDR, POD_NAME, HOST_IP (required), WORLD_SIZE (2),
# NUM_GPUS (8), RAY_PORT (6379), RAY_DASHBOARD_PORT (8265). With token authentication (RAY_AUTH_MODE=token,
# on when ~/.ray/auth_token exists) every node needs the same token (~/.ray/auth_token or RAY_AUTH_TOKEN).
# RELAX_DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail

: "${MASTER_ADDR:?set MASTER_ADDR to the hostname of the head node}"
: "${POD_NAME:?set POD_NAME to the hostname of this node}"
: "${HOST_IP:?set HOST_IP to the IP address of this node}"
WORLD_SIZE="${WORLD_SIZE:-2}"
NUM_GPUS="${NUM_GPUS:-8}"
RAY_PORT="${RAY_PORT:-6379}"
RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
REPO="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." &>/dev/null && pwd)"
RUN="${RELAX_DRY_RUN:+show}"
export RELAX_ENTRYPOINT_MODE=spmd
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0  # a node stops at once when its ray start gets SIGTERM
if [ -z "${RAY_AUTH_MODE:-}" ] && { [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -f "${HOME}/.ray/auth_token" ]; }; then
    export RAY_AUTH_MODE=token  # what ray start --head does; the workers and the driver must agree
fi
NODE=(--node-ip-address "${HOST_IP}" --num-gpus "${NUM_GPUS}" --disable-usage-stats)

show() { printf '%q ' "$@"; printf '\n'; }  # RELAX_DRY_RUN: the command, quoted for a shell

alive_nodes() {  # how many nodes have joined (a throwaway driver; ray status needs the dashboard's state API)
    python3 -c "import ray; ray.init(address='${HOST_IP}:${RAY_PORT}', logging_level='ERROR');
print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null || echo 0
}

if [ "${MASTER_ADDR}" != "${POD_NAME}" ]; then  # a worker: join, and live as long as the head
    ${RUN} ray start --address "${MASTER_ADDR}:${RAY_PORT}" "${NODE[@]}" --block
    exit 0
fi

HEAD=(ray start --head --port "${RAY_PORT}" --dashboard-host 0.0.0.0 --dashboard-port "${RAY_DASHBOARD_PORT}" "${NODE[@]}")
SUBMIT=(ray job submit --address "http://${HOST_IP}:${RAY_DASHBOARD_PORT}"
        --runtime-env-json "{\"env_vars\": {\"PYTHONPATH\": \"${REPO}\", \"RELAX_ENTRYPOINT_MODE\": \"spmd\"}}"
        -- python3 "${REPO}/relax/entrypoints/train.py" --num-gpus-per-node "${NUM_GPUS}" "$@")
if [ -n "${RELAX_DRY_RUN:-}" ]; then
    ${RUN} "${HEAD[@]}" --block
    ${RUN} "${SUBMIT[@]}"
    exit 0
fi
"${HEAD[@]}" --block &
head_pid=$!
trap 'kill "${head_pid}" 2>/dev/null; wait "${head_pid}" 2>/dev/null || true' EXIT  # the workers follow the head
for _ in $(seq 600); do  # up to 10 minutes for every node to join
    [ "$(alive_nodes)" -ge "${WORLD_SIZE}" ] && break
    kill -0 "${head_pid}" 2>/dev/null || { echo "spmd-multinode.sh: the Ray head exited" >&2; exit 1; }
    sleep 1
done
joined="$(alive_nodes)"
if [ "${joined}" -lt "${WORLD_SIZE}" ]; then
    echo "spmd-multinode.sh: ${joined} of ${WORLD_SIZE} nodes joined ${HOST_IP}:${RAY_PORT} in 10 minutes" >&2
    exit 1
fi
"${SUBMIT[@]}"
