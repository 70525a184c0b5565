#!/usr/bin/env bash
# On the GPU machine: stage one load of sglang's wheelhouse (ci/wheelhouse/build_sglang.sh) and, once both are
# staged, install them into sglang's own --target dir (ci/wheelhouse/install_loads.sh does the work).
#
#   ci/wheelhouse/install_sglang.sh LOAD_DIR        (e.g. .sgl/load2; may be absent once all are staged)
#
# SGL_STAGE (default /tmp/sglwh) accumulates the loads; SGL_SITE (default /tmp/sglsite) receives the install.
# relax's own environment is left alone: run sglang with PYTHONPATH=$SGL_SITE first.
set -euo pipefail
exec bash "$(dirname "$0")/install_loads.sh" sglang-0.5.14 "${1:?usage: install_sglang.sh LOAD_DIR}" \
  "${SGL_STAGE:-/tmp/sglwh}" "${SGL_SITE:-/tmp/sglsite}" \
  "python3 -c 'import sglang, sgl_kernel; print(sglang.__version__)'"
