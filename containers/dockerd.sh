#!/usr/bin/env bash
# A private Docker engine for the docker_scenarios session (MACHINES.md): own data/exec roots,
# pidfile and socket, no bridge, no iptables. Stopped by its PID, never by name.
#   eval "$(containers/dockerd.sh start DIR)"   -> exports DOCKER_HOST
#   containers/dockerd.sh stop DIR
set -euo pipefail
CMD="$1"; DIR="${2:-/tmp/relax-dockerd}"
case "$CMD" in
  start)
    command -v dockerd >/dev/null || apt-get install -y docker.io >&2
    mkdir -p "$DIR"
    dockerd --data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pid" \
      -H "unix://$DIR/docker.sock" --bridge=none --iptables=false >"$DIR/dockerd.log" 2>&1 &
    for _ in $(seq 60); do [ -S "$DIR/docker.sock" ] && break; sleep 0.5; done
    echo "export DOCKER_HOST=unix://$DIR/docker.sock"
    ;;
  stop)
    [ -f "$DIR/dockerd.pid" ] && kill "$(cat "$DIR/dockerd.pid")" || true
    ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
