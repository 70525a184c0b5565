#!/usr/bin/env bash
# On the GPU machine: reassemble split wheels from .whl/ (and .whl2/ or a staged copy) and
# install everything into SITE with no index and no dependency resolution.
#
#   ci/wheelhouse/install.sh SITE [PART_DIR ...]
# Then: export PYTHONPATH=SITE:$PWD
set -euo pipefail
SITE="$1"; shift
WORK="$(mktemp -d)"
for d in .whl "$@"; do [ -d "$d" ] && cp "$d"/* "$WORK"/ 2>/dev/null || true; done
for first in "$WORK"/*.whl.part00; do
  [ -e "$first" ] || continue
  base="${first%.part00}"
  cat "$base".part* > "$base"
  rm -f "$base".part*
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WORK"/*.whl
rm -rf "$WORK"
# repack.py dropped ray's dashboard web UI (client/build); the dashboard's HTTP server, which serves `ray job submit`,
# still refuses to start without that directory and its static/ (http_server_head.setup_static_dir)
[ -d "$SITE/ray/dashboard" ] && mkdir -p "$SITE/ray/dashboard/client/build/static"
echo "installed into $SITE"
