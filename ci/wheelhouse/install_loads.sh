#!/usr/bin/env bash
# On the GPU machine: stage one load of a wheelhouse packed by ci/wheelhouse/wheel_loads.py (build_sglang.sh,
# build_bridge.sh) and, once every load its manifest names is staged, check, join and install them all into a
# --target dir of their own.
#
#   ci/wheelhouse/install_loads.sh NAME LOAD_DIR STAGE SITE CHECK
#
# NAME: what is installed (messages and SITE/.NAME.installed, which makes a later call a no-op); LOAD_DIR: this
# call's load (e.g. .bridge/load1; may be absent once all are staged); STAGE accumulates the loads (files under /tmp
# survive between back-to-back calls while the machine is kept warm); SITE receives the install; CHECK: a command
# run afterwards with PYTHONPATH=SITE first. The machine's own environment is left alone. Exit 0 while loads are
# still missing (it names them). install_sglang.sh and install_bridge.sh call this with their names and dirs.
set -euo pipefail
NAME="${1:?usage: install_loads.sh NAME LOAD_DIR STAGE SITE CHECK}"
LOAD="${2:?}"
STAGE="${3:?}"
SITE="${4:?}"
CHECK="${5:?}"
HERE="$(cd "$(dirname "$0")" && pwd)"
DONE="$SITE/.$NAME.installed"
if [ -f "$DONE" ]; then
  echo "install_loads: $NAME is already installed in $SITE; nothing to do"
  exit 0
fi
mkdir -p "$STAGE"
if [ -d "$LOAD" ]; then
  cp -f "$LOAD"/* "$STAGE"/
  echo "install_loads: staged $(ls "$LOAD" | wc -l) files of $LOAD into $STAGE"
fi
[ -f "$STAGE/manifest.json" ] || { echo "install_loads: no manifest.json in $LOAD or $STAGE" >&2; exit 1; }
rc=0
python3 "$HERE/wheel_loads.py" assemble "$STAGE" "$STAGE/wheels" || rc=$?
[ "$rc" = 3 ] && exit 0  # more loads to come; the line above named them
[ "$rc" = 0 ] || exit "$rc"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$STAGE"/wheels/*.whl
touch "$DONE"
rm -rf "$STAGE"
echo "install_loads: installed $(ls "$SITE" | grep -c '\.dist-info$') distributions into $SITE"
echo "install_loads: PYTHONPATH=$SITE:\$PYTHONPATH $CHECK"
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" bash -c "$CHECK"
