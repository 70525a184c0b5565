#!/usr/bin/env bash
# On the GPU machine: stage one load of sglang's wheelhouse (ci/wheelhouse/build_sglang.sh) and, once every load
# named by its manifest is staged, check, join and install them all into sglang's own --target dir.
#
#   ci/wheelhouse/install_sglang.sh LOAD_DIR        (e.g. .sgl/load2; may be absent once all are staged)
#
# Loads travel in separate device calls; files under /tmp survive between back-to-back calls while the machine is
# kept warm. SGL_STAGE (default /tmp/sglwh) accumulates them; SGL_SITE (default /tmp/sglsite) receives the install.
# relax's own environment is left alone: run sglang with PYTHONPATH=$SGL_SITE first. Idempotent: once sglang 0.5.14
# is installed there it says so and does nothing. Exit 0 while loads are still missing (it names them).
set -euo pipefail
LOAD="${1:?usage: install_sglang.sh LOAD_DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
STAGE="${SGL_STAGE:-/tmp/sglwh}"
SITE="${SGL_SITE:-/tmp/sglsite}"
DONE="$SITE/.sglang-0.5.14.installed"
CHECK="PYTHONPATH=$SITE python3 -c 'import sglang, sgl_kernel; print(sglang.__version__)'"
if [ -f "$DONE" ]; then
  echo "install_sglang: sglang 0.5.14 is already installed in $SITE; nothing to do"
  exit 0
fi
mkdir -p "$STAGE"
if [ -d "$LOAD" ]; then
  cp -f "$LOAD"/* "$STAGE"/
  echo "install_sglang: staged $(ls "$LOAD" | wc -l) files of $LOAD into $STAGE"
fi
[ -f "$STAGE/manifest.json" ] || { echo "install_sglang: no manifest.json in $LOAD or $STAGE" >&2; exit 1; }
rc=0
python3 "$HERE/sglang_loads.py" assemble "$STAGE" "$STAGE/wheels" || rc=$?
[ "$rc" = 3 ] && exit 0  # more loads to come; the line above named them
[ "$rc" = 0 ] || exit "$rc"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$STAGE"/wheels/*.whl
touch "$DONE"
rm -rf "$STAGE"
echo "install_sglang: installed $(ls "$SITE" | grep -c '\.dist-info$') distributions into $SITE"
echo "install_sglang: $CHECK"
eval "$CHECK"
