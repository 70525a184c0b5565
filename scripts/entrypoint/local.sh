#!/bin/bash
# Single-node entrypoint (seeds 001/004): start a Ray head on this machine, or reuse the one already
# listening on RAY_PORT, and point relax at it through RAY_ADDRESS.
#
#   source scripts/entrypoint/local.sh            # in a run script; then: python3 relax/entrypoints/train.py ...
#   bash scripts/entrypoint/local.sh FLAGS...     # head up, then: python3 relax/entrypoints/train.py FLAGS...
#                                                 # (RELAX_SUBMIT=1: through ray job submit; needs ray[default])
#
# Environment: RAY_PORT (6379), RAY_DASHBOARD_PORT (8265), NUM_GPUS / NUM_CPUS (Ray detects them when
# unset), RAY_TEMP_DIR (Ray's default /tmp/ray when unset). RELAX_DRY_RUN=1 prints the commands instead
# of running them. Run as a command, the script stops the head it started (by its PID) when the run ends;
# sourced, it leaves the head running for the caller (stop it with `ray stop` when done).

_relax_show() { printf '%q ' "$@"; printf '\n'; }  # RELAX_DRY_RUN: the command, quoted for a shell

_relax_local_env() {
    RELAX_REPO="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." &>/dev/null && pwd)"
    RELAX_RUN="${RELAX_DRY_RUN:+_relax_show}"
    export RELAX_ENTRYPOINT_MODE=local
    export PYTHONPATH="${RELAX_REPO}${PYTHONPATH:+:${PYTHONPATH}}"
    export RAY_PORT="${RAY_PORT:-6379}"
    export RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
    export RAY_ADDRESS="127.0.0.1:${RAY_PORT}"
    # ray start turns token authentication on when a token exists; the driver must then send it too
    if [ -z "${RAY_AUTH_MODE:-}" ] && { [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -f "${HOME}/.ray/auth_token" ]; }; then
        export RAY_AUTH_MODE=token
    fi
    # relax gives each actor one thread and offline hubs itself; the job only needs to import the repo
    export RUNTIME_ENV_JSON="{\"env_vars\": {\"PYTHONPATH\": \"${RELAX_REPO}\", \"RELAX_ENTRYPOINT_MODE\": \"local\"}}"
    RELAX_HEAD=(ray start --head --port "${RAY_PORT}" --dashboard-host 127.0.0.1 --dashboard-port "${RAY_DASHBOARD_PORT}"
                --disable-usage-stats)
    if [ -n "${NUM_GPUS:-}" ]; then RELAX_HEAD+=(--num-gpus "${NUM_GPUS}"); fi
    if [ -n "${NUM_CPUS:-}" ]; then RELAX_HEAD+=(--num-cpus "${NUM_CPUS}"); fi
    if [ -n "${RAY_TEMP_DIR:-}" ]; then RELAX_HEAD+=(--temp-dir "${RAY_TEMP_DIR}"); fi
}

_relax_head_running() {
    [ -z "${RELAX_DRY_RUN:-}" ] && (exec 3<>"/dev/tcp/127.0.0.1/${RAY_PORT}") 2>/dev/null
}

_relax_train_command() {
    if [ -n "${RELAX_SUBMIT:-}" ]; then
        ${RELAX_RUN} ray job submit --address "http://127.0.0.1:${RAY_DASHBOARD_PORT}" \
            --runtime-env-json "${RUNTIME_ENV_JSON}" -- python3 "${RELAX_REPO}/relax/entrypoints/train.py" "$@"
    else
        ${RELAX_RUN} python3 "${RELAX_REPO}/relax/entrypoints/train.py" "$@"
    fi
}

if [[ "${BASH_SOURCE[0]}" != "${0}" ]]; then  # sourced: leave Ray up for the caller's own train.py command
    _relax_local_env
    if _relax_head_running; then
        echo "local.sh: reusing the Ray cluster at ${RAY_ADDRESS}"
    else
        ${RELAX_RUN} "${RELAX_HEAD[@]}" || return 1
    fi
else
    set -euo pipefail
    _relax_local_env
    if _relax_head_running; then
        echo "local.sh: reusing the Ray cluster at ${RAY_ADDRESS}"
    elif [ -n "${RELAX_DRY_RUN:-}" ]; then
        _relax_show "${RELAX_HEAD[@]}" --block
    else  # --block keeps the head under this one PID, so the script stops exactly what it started
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 "${RELAX_HEAD[@]}" --block &
        head_pid=$!
        trap 'kill "${head_pid}" 2>/dev/null; wait "${head_pid}" 2>/dev/null || true' EXIT
        for _ in $(seq 120); do
            _relax_head_running && break
            kill -0 "${head_pid}" 2>/dev/null || { echo "local.sh: ray start --head failed" >&2; exit 1; }
            sleep 0.5
        done
        _relax_head_running || { echo "local.sh: the Ray head did not open port ${RAY_PORT} in 60 s" >&2; exit 1; }
    fi
    _relax_train_command "$@"
fi
