#!/bin/bash
# Usage: bash examples/arith_env/run_arith.sh [sync|async]
# Seed 004's dual-mode launch script for the multi-turn running-sum environment, on CPU with the
# tiny-qwen3 preset (MODEL_DIR may name an HF directory instead; then source its scripts/models file).
# Prerequisites (done below when missing):
#   1. verl data:    python3 -m examples.arith_env.make_data ${DATA_DIR}/arith_verl.parquet
#   2. Convert data: relax convert-data ${DATA_DIR}/arith_verl.parquet ${DATA_DIR}/arith.parquet
set -ex
set -o pipefail
MODE=${1:-${MODE:-"sync"}}
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
EXP_DIR=${EXP_DIR:-runs}
DATA_DIR=${DATA_DIR:-${EXP_DIR}/data}
MODEL=${MODEL:-tiny-qwen3}
MODEL_CONFIG_DIR=${MODEL_CONFIG_DIR:-scripts/models}
source "${MODEL_CONFIG_DIR}/tiny-qwen3.sh"
mkdir -p "${DATA_DIR}"
[ -f "${DATA_DIR}/arith.parquet" ] || {
  python3 -m examples.arith_env.make_data "${DATA_DIR}/arith_verl.parquet"
  relax convert-data "${DATA_DIR}/arith_verl.parquet" "${DATA_DIR}/arith.parquet"
}

CKPT_ARGS=(--hf-checkpoint "${MODEL}" --ref-load "${MODEL}")
ROLLOUT_ARGS=(
  --prompt-data "['${DATA_DIR}/arith.parquet']" --input-key prompt --label-key label --metadata-key extra_info
  --apply-chat-template
  --custom-rm-path examples.arith_env.reward_arith.reward_func --reward-key score
  --custom-generate-function-path examples.arith_env.rollout.generate
  --custom-config-path examples/arith_env/arith_config.yaml
  --num-rollout "${NUM_ROLLOUT:-200}" --rollout-batch-size 32 --n-samples-per-prompt 8
  --rollout-max-response-len 32 --rollout-temperature 1
  --global-batch-size 256 --micro-batch-size 64 --rollout-shuffle
)
GRPO_ARGS=(--advantage-estimator grpo --entropy-coef 0.01 --eps-clip 0.2 --eps-clip-high 0.28)
OPTIMIZER_ARGS=(--optimizer adam --lr 3e-3 --weight-decay 0.0 --clip-grad 1.0)
LOG_ARGS=(--use-tensorboard --output-dir "${EXP_DIR}/arith-${MODE}")
MISC_ARGS=(--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32)

if [ "${MODE}" = "async" ]; then
  python3 relax/entrypoints/train.py --fully-async --max-staleness 2 --num-data-storage-units 1 \
    "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${GRPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" \
    "${LOG_ARGS[@]}" "${MISC_ARGS[@]}"
else
  python3 relax/entrypoints/train.py --colocate --max-staleness 1 \
    "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${GRPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" \
    "${LOG_ARGS[@]}" "${MISC_ARGS[@]}"
fi
