#!/usr/bin/env bash
# Multi-turn GRPO on the two-turn arithmetic environment (CPU, a few minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
relax train --preset quickstart --prompt-data examples/multi_turn/data.jsonl \
  --custom-generate-function-path examples.multi_turn.rollout.generate \
  --custom-rm-path examples.multi_turn.rollout.reward \
  --output-dir runs/multi_turn "$@"
