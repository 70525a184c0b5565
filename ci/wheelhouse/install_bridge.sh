#!/usr/bin/env bash
# On the GPU machine: stage one load of megatron-bridge's wheelhouse (ci/wheelhouse/build_bridge.sh) and, once all
# are staged, install them into megatron-bridge's own --target dir (ci/wheelhouse/install_loads.sh does the work).
#
#   ci/wheelhouse/install_bridge.sh LOAD_DIR        (e.g. .bridge/load1; may be absent once all are staged)
#
# BRIDGE_STAGE (default /tmp/bridgewh) accumulates the loads; BRIDGE_SITE (default /tmp/bridgesite) receives the
# install: megatron-bridge 0.6.2, transformers 5.12.1, tokenizers 0.22.2, omegaconf 2.4.0. relax's environment keeps
# the machine's transformers 5.17.0: only a process started with PYTHONPATH=$BRIDGE_SITE first sees 5.12.1 (and
# megatron-core from relax's /tmp/site, after it). The check imports AutoBridge that way once megatron-core is there
# (ci/wheelhouse/install.sh; a call that carries only this load has none yet: then transformers alone is checked).
set -euo pipefail
exec bash "$(dirname "$0")/install_loads.sh" megatron-bridge-0.6.2 "${1:?usage: install_bridge.sh LOAD_DIR}" \
  "${BRIDGE_STAGE:-/tmp/bridgewh}" "${BRIDGE_SITE:-/tmp/bridgesite}" \
  'MC=${RELAX_SITE:-/tmp/site}; python3 -c "import transformers; print(\"transformers\", transformers.__version__)";
   if [ -d "$MC/megatron/core" ]; then PYTHONPATH=$PYTHONPATH:$MC python3 -c "from megatron.bridge import AutoBridge; print(\"AutoBridge imports\")";
   else echo "no megatron-core in $MC yet: bridge_run checks the AutoBridge import"; fi'
