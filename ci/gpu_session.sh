#!/usr/bin/env bash
# One GPU session on the air-gapped GPU machine (see ci/wheelhouse/): install the carried
# wheels, then run the GPU measurements and write everything under $OUT.
#   ci/gpu_session.sh PART1_DIR [what ...]      what: bench | colocate | scenarios | megatron | grpo (default: all)
#                                                or bench_order | engine_tests | gpu_tests | baselines | gpu_scenarios
#                                                (only when named):
#   bench          BENCH_RUNNERS picks the runners (default: lean+graph lean+graph+compile)
#   attention      ci/bench_decode_attention.py: the Triton decode-attention configs against the baddbmm reference
#   engine_tests   pytest tests/test_engine_gpu.py: the lean runner and its Triton decode attention on the GPU
#   gpu_tests      pytest tests/gpu (not multi_gpu) + the relax convert tests, JUnit and reports in $OUT
#   bench_order    ci/bench_engine.py with every runner in one process (the default gives each its own)
#   baselines      records this GPU class's throughput baselines (5 runs of each GPU scenario with a throughput
#                  check) into $OUT/baselines/<class>.json; commit that file to ci/baselines/
#   gpu_scenarios  what `nox -s gpu_scenarios` runs (ci/sessions.py): every GPU scenario, throughput against
#                  ci/baselines (required), then the gate; results, JUnit, report and summary in $OUT/gpu_scenarios
# Multi-GPU items (issue "Many GPUs"; each fits one device call, JSON / JUnit under $OUT):
#   multi_gpu_tests  pytest -m multi_gpu tests/gpu except the layout parity (the cross-GPU NCCL push, the seed's
#                    colocate layout, relax train at TP=2)
#   layout_parity    pytest -m multi_gpu tests/gpu -k parallel_layout (each layout against one GPU, plain processes)
#   multi_gpu_scenarios  every multi_gpu scenario (scenarios/specs/parallel.yaml, fully-async on separate GPUs, DP
#                    parity), MULTI_GPU_WORKERS at a time (default 2), MULTI_GPU_K a -k selection
#   async_gpus       ci/bench_async_gpus.py: colocate vs fully-async k=1, k=2 on 2 GPUs
#   overlap          ci/bench_overlap.py: Megatron DP 2 plain vs --overlap-grad-reduce --overlap-param-gather (2 GPUs)
#   async_save       ci/bench_async_save.py on Megatron (bench-270m, a save every step): plain vs --async-save
#   sync_nccl        ci/bench_sync_nccl.py: bench-1b pushed by NCCL to an engine on another GPU, s/GB by phase
#   two_nodes        tests/gpu/test_two_nodes_gpu.py: two Ray nodes of one host, relax train and ray job submit
#   sglang_stage     one load of sglang 0.5.14's wheelhouse (SGLANG_LOAD=i, carry .sgl/load<i>; back-to-back calls)
#   bridge_stage     megatron-bridge 0.6.2's wheelhouse (ci/wheelhouse/build_bridge.sh; BRIDGE_LOAD=i, default 1, carry
#                    .bridge/load<i>) into /tmp/bridgesite (transformers 5.12.1 there; relax's environment keeps 5.17)
#   bridge_run       issue 39 run 5 (after bridge_stage; carry .whl): ci/bridge_run.py with /tmp/bridgesite first on its
#                    PYTHONPATH only: BRIDGE_MODEL (qwen3-0.5b) written as an HF dir, AutoBridge load + export bit for
#                    bit, then relax train --megatron-to-hf-mode bridge for BRIDGE_STEPS (3) with every sync checked
#   sglang_smoke     sglang.launch_server from /tmp/sglsite on a tiny Qwen3: /health_generate and one /generate
#   sglang_conformance  tests/conformance against sglang.launch_server (tiny Qwen3, --enable-memory-saver): JUnit,
#                    endpoint report ($OUT/sglang_conformance.json) and the server log in $OUT (after sglang_stage)
#   sglang_colocate  relax train --rollout-backend sglang --colocate, Megatron, one GPU (after sglang_stage)
#   sglang_runs      ci/sglang_runs.py: SGLANG_RUN colocate | async | external with real SGLang (issue 39 runs 1, 3)
#   sglang_vlm       issue 44 (after sglang_stage; carry .whl): ci/sglang_runs.py vlm: relax train --preset vlm-quickstart
#                    --device cuda --bf16 with real SGLang (10 steps of 16-token answers, every sync checked), then the
#                    embedded engine; SGLANG_VLM_MODEL (tiny-qwen2.5-vl-p14), SGLANG_STEPS (10), SGLANG_VLM_ARGS adds
#                    sglang_runs flags (--fp32, --engines sglang); JSON, log tails and one .tgz of both runs' artifacts
#   sglang_decode    issue 39 run 2: ci/bench_engine.py, the embedded engine (SGLANG_DECODE_RUNNERS, default
#                    lean+graph+compile) vs real SGLang (/tmp/sglsite, after sglang_stage) at batches 64 and 256:
#                    tok/s, % of roofline, embedded / SGLang; SGLANG_DECODE_ARGS adds flags (HF rows left out: --no-hf)
#   bench_4b         ci/bench_4b.py: scripts/models/qwen3-4B.sh's model at TP=2 x DP=2 on 4 GPUs, colocate (BENCH_4B_ARGS adds flags)
#   scaling          ci/bench_scaling.py: the GRPO workload on SCALING_GPUS GPUs (default "1 2"), data parallel colocate
# grpo: GRPO_TRL_MODES picks TRL's paths (default: all three), GRPO_SYSTEMS the systems (default: trl relax-megatron;
# relax-megatron-sglang adds relax-megatron with real SGLang from /tmp/sglsite, after sglang_stage),
# GRPO_STEPS the steps per TRL row (default 6), GRPO_RELAX_STEPS per relax row (default 12). It also needs .whl4/ (TRL's wheels, ci/wheelhouse/build.sh); without it the TRL row is skipped.
set -uo pipefail
# One device call may run 600 s in all, install included: every item's own limit is cut to what is left of
# RELAX_SESSION_BUDGET_S (counted from here), so a late item stops itself and its partial output still comes back.
END=$(( $(date +%s) + ${RELAX_SESSION_BUDGET_S:-590} ))
cap() { local left=$(( END - $(date +%s) )); [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"; }
PART1="$1"; shift
WHAT="${*:-bench colocate scenarios megatron grpo}"
SITE=/tmp/site
TRL_SITE=/tmp/site_trl  # its own dir, last on PYTHONPATH: TRL's wheels shadow nothing the other items use
# calls that only stage or smoke-test SGLang carry one .sgl/load<i>, not .whl: no ray install or check
NEEDS_RAY=0; for w in $WHAT; do case $w in sglang_stage|sglang_smoke|sglang_conformance|bridge_stage) ;; *) NEEDS_RAY=1 ;; esac; done
[ $NEEDS_RAY = 0 ] || [ -d "$SITE/ray" ] || bash ci/wheelhouse/install.sh "$SITE" "$PART1" .whl2 || exit 1
export PYTHONPATH="$SITE:$PWD:$TRL_SITE" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
[ $NEEDS_RAY = 0 ] || python3 -c "import ray, torch, transformers; print('ray', ray.__version__, 'torch', torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
for w in $WHAT; do
  case $w in
    bench) # HF generate + the two graph runners at batches 64 and 256 (6 fresh processes, ~6 min on the H100; all
           # six runners do not fit one call: `python3 ci/bench_engine.py` alone runs them); rows land in the JSON as
           # they finish
           # (BENCH_ARGS adds bench_engine flags, e.g. "--batches 64 --no-hf")
           timeout $(cap 580) python3 ci/bench_engine.py --profile --runners ${BENCH_RUNNERS:-lean+graph lean+graph+compile} \
             ${BENCH_ARGS:-} --json "$OUT/bench_engine.json" 2>&1 | tee "$OUT/bench_engine.txt" ;;
    bench_order) # the same runners in one process, compiled runner last: does what ran before slow it down?
                 timeout $(cap 580) python3 ci/bench_engine.py --in-process --batches 64 --json "$OUT/bench_engine_in_process.json" \
                   2>&1 | tee "$OUT/bench_engine_in_process.txt" ;;
    colocate) timeout $(cap 200) python3 -m relax.cli train --preset quickstart --device cuda --num-rollout 40 \
                --output-dir "$OUT/gpu_colocate" 2>&1 | tail -8 | tee "$OUT/gpu_colocate.txt"
              python3 -m relax.metrics.summary "$OUT/gpu_colocate" | tee -a "$OUT/gpu_colocate.txt"
              python3 ci/run_figures.py "$OUT/gpu_colocate" --json "$OUT/gpu_colocate_figures.json" \
                | tee -a "$OUT/gpu_colocate.txt" ;;
    scenarios) [ -f noxfile.py ] && timeout $(cap 300) python3 -m pytest scenarios -p harness.pytest_plugin \
                --harness-profile gpu -k "colocate and not megatron" -q 2>&1 | tail -20 | tee "$OUT/gpu_scenarios.txt" ;;
    megatron) timeout $(cap 330) python3 ci/bench_megatron.py --json "$OUT/bench_megatron.json" 2>&1 | tee "$OUT/bench_megatron.txt"
              timeout $(cap 540) python3 -m pytest scenarios -p harness.pytest_plugin --harness-profile gpu -k megatron \
                --harness-results "$OUT/megatron_scenarios" -q 2>&1 | tail -30 | tee "$OUT/megatron_scenarios.txt" ;;
    attention) timeout $(cap 200) python3 ci/bench_decode_attention.py --json "$OUT/bench_decode_attention.json" 2>&1 \
                 | tee "$OUT/bench_decode_attention.txt" ;;
    engine_tests) timeout $(cap 300) python3 -m pytest -q -rs tests/test_engine_gpu.py --junitxml "$OUT/engine_tests.xml" \
                    2>&1 | tail -40 | tee "$OUT/engine_tests.txt" ;;
    gpu_tests) # the one-GPU pytest lines of issues 17 and 20 (Megatron through the new parallel state reproduces
               # commit 3f12622 bitwise when .megatron_base is carried; relax convert round trip; CUDA-IPC colocate)
               RELAX_MEGATRON_BASE=$PWD/.megatron_base RELAX_GPU_REPORT="$OUT/gpu_tests" timeout $(cap 585) python3 -m pytest \
                 -q -rs -m "not multi_gpu" tests/gpu tests/test_relax_convert.py --junitxml "$OUT/gpu_tests.xml" \
                 2>&1 | tail -60 | tee "$OUT/gpu_tests.txt" ;;
    multi_gpu_tests) RELAX_GPU_REPORT="$OUT/multi_gpu_tests" timeout $(cap 585) python3 -m pytest -q -rs -m multi_gpu \
                       tests/gpu -k "not parallel_layout" --junitxml "$OUT/multi_gpu_tests.xml" 2>&1 | tail -60 \
                       | tee "$OUT/multi_gpu_tests.txt" ;;
    layout_parity) RELAX_GPU_REPORT="$OUT/layout_parity" timeout $(cap 585) python3 -m pytest -q -rs -m multi_gpu \
                     tests/gpu -k parallel_layout --junitxml "$OUT/layout_parity.xml" 2>&1 | tail -40 \
                     | tee "$OUT/layout_parity.txt" ;;
    multi_gpu_scenarios) timeout $(cap 585) python3 -m pytest scenarios -p harness.pytest_plugin -q -rs \
                           -n "${MULTI_GPU_WORKERS:-2}" -m multi_gpu ${MULTI_GPU_K:+-k "$MULTI_GPU_K"} --harness-profile gpu \
                           --harness-results "$OUT/multi_gpu_scenarios" --junitxml "$OUT/multi_gpu_scenarios/junit.xml" \
                           --durations=0 2>&1 | tail -60 | tee "$OUT/multi_gpu_scenarios.txt" ;;
    async_gpus) timeout $(cap 585) python3 ci/bench_async_gpus.py --steps ${ASYNC_STEPS:-8} --json "$OUT/bench_async_gpus.json" \
                  --workdir /tmp/async_runs 2>&1 | tee "$OUT/bench_async_gpus.txt" ;;
    two_nodes) timeout $(cap 300) python3 -m pytest -q -rs tests/gpu/test_two_nodes_gpu.py -k "not ray_job" \
                 --junitxml "$OUT/two_nodes.xml" 2>&1 | tail -60 | tee "$OUT/two_nodes.txt"
               # ray job submit needs Ray's dashboard: its packages (.whl5) in a dir of their own, on this run's path only
               [ -d /tmp/site_dash/aiohttp_cors ] || python3 -m pip install -q --no-index --no-deps --no-compile \
                 --target /tmp/site_dash .whl5/*.whl
               PYTHONPATH="/tmp/site_dash:$PYTHONPATH" timeout $(cap 300) python3 -m pytest -q -rs \
                 tests/gpu/test_two_nodes_gpu.py -k ray_job --junitxml "$OUT/two_nodes_job.xml" 2>&1 | tail -60 \
                 | tee "$OUT/two_nodes_job.txt" ;;
    bench_4b) timeout $(cap 585) python3 ci/bench_4b.py --json "$OUT/bench_4b.json" --workdir /tmp/bench_4b \
                --timeout $(( $(cap 585) - 30 )) ${BENCH_4B_ARGS:-} 2>&1 | tee "$OUT/bench_4b.txt"
              cp /tmp/bench_4b/relax_train.log "$OUT/bench_4b_relax_train.log" 2>/dev/null ;;
    scaling) timeout $(cap 585) python3 ci/bench_scaling.py --gpus ${SCALING_GPUS:-1 2} --json "$OUT/bench_scaling.json" \
               --workdir /tmp/scaling_runs 2>&1 | tee "$OUT/bench_scaling.txt" ;;
    sglang_stage) # one load of sglang 0.5.14's wheelhouse per call (ci/wheelhouse/build_sglang.sh; carry .sgl/load$SGLANG_LOAD,
                  # not .whl); after the last load it checks sha256, joins and installs into /tmp/sglsite (idempotent)
                  bash ci/wheelhouse/install_sglang.sh ".sgl/load${SGLANG_LOAD:?set SGLANG_LOAD=1..N}" 2>&1 \
                    | tee -a "$OUT/sglang_stage.txt" ;;
    bridge_stage) # one load per call (one today); after the last it checks sha256, joins and installs (idempotent)
                  bash ci/wheelhouse/install_bridge.sh ".bridge/load${BRIDGE_LOAD:-1}" 2>&1 | tee -a "$OUT/bridge_stage.txt" ;;
    bridge_run) [ -f /tmp/bridgesite/.megatron-bridge-0.6.2.installed ] || { echo "bridge_run: run bridge_stage first" \
                  | tee "$OUT/bridge_run.txt"; continue; }
                PYTHONPATH="/tmp/bridgesite:$PYTHONPATH" timeout $(cap 585) python3 ci/bridge_run.py \
                  --model "${BRIDGE_MODEL:-qwen3-0.5b}" --steps "${BRIDGE_STEPS:-3}" --timeout $(( $(cap 585) - 150 )) \
                  --workdir /tmp/bridge_run --json "$OUT/bridge_run.json" 2>&1 | tee "$OUT/bridge_run.txt"
                tail -60 /tmp/bridge_run/relax_train.log > "$OUT/bridge_relax_train_tail.txt" 2>/dev/null
                mkdir -p "$OUT/bridge_train" && cp /tmp/bridge_run/train/*.jsonl /tmp/bridge_run/train/run.json \
                  "$OUT/bridge_train/" 2>/dev/null ;;
    sglang_smoke) # python3 -m sglang.launch_server (PYTHONPATH=/tmp/sglsite) on a tiny random-init Qwen3, port 30000, offline,
                  # --attention-backend triton|flashinfer (never fa3) --sampling-backend pytorch --grammar-backend none;
                  # waits for /health_generate, sends one /generate, stops the server
                  timeout $(cap 540) python3 ci/wheelhouse/sglang_smoke.py --port 30000 \
                    --attention-backend "${SGLANG_ATTENTION:-triton}" --startup-timeout $(( $(cap 540) - 60 )) \
                    --json "$OUT/sglang_smoke.json" 2>&1 | tee "$OUT/sglang_smoke.txt"
                  cp /tmp/sglang_smoke_server.log "$OUT/" 2>/dev/null ;;
    sglang_conformance) # issue 39 run 6: every endpoint and field relax sends or reads, against real SGLang 0.5.14
                        timeout $(cap 570) python3 ci/wheelhouse/sglang_conformance.py --port 30000 --out "$OUT" \
                          --startup-timeout $(( $(cap 570) - 200 )) --pytest-timeout 400 2>&1 \
                          | tee "$OUT/sglang_conformance.txt" ;;
    sglang_colocate) # issue 39 run 1: relax train with real SGLang 0.5.14 (from /tmp/sglsite: sglang_stage) colocated with the
                     # Megatron trainer on one GPU; SGLANG_MODEL (default small-qwen3), SGLANG_STEPS (default 10)
                     RELAX_SGLANG_PYTHONPATH=/tmp/sglsite timeout $(cap 585) python3 -m relax.cli train --device cuda \
                       --train-backend megatron --hf-checkpoint "${SGLANG_MODEL:-small-qwen3}" --rollout-backend sglang \
                       --colocate --prompt-data relax/models/tasks/maxdigit.jsonl --input-key prompt --label-key label \
                       --custom-rm-path harness.rewards.digit_share --rollout-max-response-len 24 --lr 3e-3 \
                       --rollout-batch-size 8 --n-samples-per-prompt 4 --global-batch-size 32 --micro-batch-size 16 \
                       --num-rollout "${SGLANG_STEPS:-10}" --sglang-attention-backend triton --sglang-grammar-backend none \
                       --sglang-sampling-backend pytorch --sglang-mem-fraction-static 0.3 --sglang-disable-prefill-cuda-graph \
                       --sglang-cuda-graph-max-bs-decode 32 --output-dir /tmp/sglang_colocate 2>&1 | tail -40 \
                       | tee "$OUT/sglang_colocate.txt"
                     mkdir -p "$OUT/sglang_colocate" && cp /tmp/sglang_colocate/*.json* "$OUT/sglang_colocate/" 2>/dev/null
                     tail -30 /tmp/sglang_colocate/sglang-engine-*.log > "$OUT/sglang_colocate/engine_log_tail.txt" 2>/dev/null ;;
    sglang_runs) # issue 39 runs 1 and 3 (ci/sglang_runs.py, after sglang_stage): SGLANG_RUN colocate (one GPU: SGLang and
                 # the embedded engine on one config, SGLANG_MODEL), async or external (two GPUs); SGLANG_STEPS (10)
                 # colocate runs SGLang and then the embedded engine: each gets half the call; async and external one run
                 T=$(cap 590); [ "${SGLANG_RUN:-colocate}" = colocate ] && T=$(( T / 2 ))
                 RELAX_SGLANG_PYTHONPATH=/tmp/sglsite timeout $(cap 590) python3 ci/sglang_runs.py "${SGLANG_RUN:-colocate}" \
                   --model "${SGLANG_MODEL:-bench-270m}" --steps "${SGLANG_STEPS:-10}" --timeout $(( T - 10 )) \
                   --workdir "/tmp/sglang_runs_${SGLANG_RUN:-colocate}_${SGLANG_MODEL:-bench-270m}" \
                   --json "$OUT/sglang_${SGLANG_RUN:-colocate}_${SGLANG_MODEL:-bench-270m}.json" 2>&1 \
                   | tee "$OUT/sglang_${SGLANG_RUN:-colocate}_${SGLANG_MODEL:-bench-270m}.txt"
                 for f in /tmp/sglang_runs_${SGLANG_RUN:-colocate}_${SGLANG_MODEL:-bench-270m}/*.log; do
                   tail -40 "$f" > "$OUT/$(basename "$f" .log)_tail.txt"; done
                 for d in /tmp/sglang_runs_${SGLANG_RUN:-colocate}_${SGLANG_MODEL:-bench-270m}/*/; do
                   [ -f "$d/weights.jsonl" ] || continue; mkdir -p "$OUT/runs/$(basename "$d")"
                   cp "$d"/*.jsonl "$d"/run.json "$OUT/runs/$(basename "$d")/" 2>/dev/null
                   tail -30 "$d"/sglang-engine-*.log > "$OUT/runs/$(basename "$d")/engine_log_tail.txt" 2>/dev/null; done ;;
    sglang_vlm) # SGLang first, with all but 150 s of the call; the embedded run (45 s on the H200) gets 120 s
                [ -f /tmp/sglsite/sglang/__init__.py ] || { echo "sglang_vlm: run sglang_stage first" \
                  | tee "$OUT/sglang_vlm.txt"; continue; }
                RELAX_SGLANG_PYTHONPATH=/tmp/sglsite timeout $(cap 590) python3 ci/sglang_runs.py vlm \
                  --model "${SGLANG_VLM_MODEL:-tiny-qwen2.5-vl-p14}" --steps "${SGLANG_STEPS:-10}" \
                  --timeout $(( $(cap 590) - 150 )) --embedded-timeout 120 ${SGLANG_VLM_ARGS:-} \
                  --workdir /tmp/sglang_runs_vlm --json "$OUT/sglang_vlm.json" 2>&1 | tee "$OUT/sglang_vlm.txt"
                for f in /tmp/sglang_runs_vlm/*.log; do
                  [ -f "$f" ] && tail -60 "$f" > "$OUT/$(basename "$f" .log)_tail.txt"; done
                tail -80 /tmp/sglang_runs_vlm/*/sglang-engine-*.log > "$OUT/sglang_vlm_engine_log_tail.txt" 2>/dev/null
                tar czf "$OUT/sglang_vlm_runs.tgz" -C /tmp/sglang_runs_vlm --exclude=sglang_model . 2>/dev/null ;;
    sglang_decode) RELAX_SGLANG_PYTHONPATH=/tmp/sglsite timeout $(cap 585) python3 ci/bench_engine.py \
                     --runners ${SGLANG_DECODE_RUNNERS:-lean+graph+compile} sglang --batches 64 256 --no-hf \
                     ${SGLANG_DECODE_ARGS:-} --json "$OUT/bench_engine_sglang.json" 2>&1 | tee "$OUT/bench_engine_sglang.txt"
                   tail -60 /tmp/bench_engine_sglang_server.log > "$OUT/bench_engine_sglang_server_log_tail.txt" 2>/dev/null ;;
    async_save) # issue 41: Megatron --async-save's step-time cost: bench-270m saving every step, plain vs --async-save
                timeout $(cap 400) python3 ci/bench_async_save.py --steps ${ASYNC_SAVE_STEPS:-8} --flags \
                  "--device cuda --train-backend megatron --hf-checkpoint bench-270m --prompt-data relax/models/tasks/maxword.jsonl ${ASYNC_SAVE_FLAGS:-}" \
                  --out "$OUT/async_save_megatron.json" 2>&1 | tee "$OUT/async_save_megatron.txt" ;;
    overlap) # issue 41: megatron-core DDP's --overlap-grad-reduce / --overlap-param-gather on 2 GPUs (bench-270m, DP 2,
             # distributed optimizer, colocate): per-step loss / grad norm gap and the train-time ratio; OVERLAP_FLAGS adds flags
             timeout $(cap 560) python3 ci/bench_overlap.py --steps ${OVERLAP_STEPS:-8} --flags "${OVERLAP_FLAGS:-}" \
               --keep "$OUT/overlap_runs" --out "$OUT/bench_overlap.json" 2>&1 | tee "$OUT/bench_overlap.txt" ;;
    sync_nccl) timeout $(cap 300) python3 ci/bench_sync_nccl.py --json "$OUT/bench_sync_nccl.json" 2>&1 \
                 | tee "$OUT/bench_sync_nccl.txt" ;;
    baselines) timeout $(cap 585) python3 -m harness baseline record --profile gpu --runs 5 --baselines "$OUT/baselines" \
                 --results /tmp/baseline-runs 2>&1 | tee "$OUT/baselines.txt"
               cp /tmp/baseline-runs/results.json "$OUT/baseline-runs.json" 2>/dev/null ;;
    gpu_scenarios) timeout $(cap 585) python3 -m ci.sessions gpu_scenarios -q --durations=0 2>&1 | tail -80 \
                     | tee "$OUT/gpu_scenarios.txt"
                   mkdir -p "$OUT/gpu_scenarios" && cp harness-results/gpu/*.* "$OUT/gpu_scenarios/" ;;
    grpo) [ -d "$TRL_SITE/trl" ] || [ ! -d .whl4 ] || python3 -m pip install -q --no-index --no-deps --no-compile \
            --target "$TRL_SITE" .whl4/*.whl
          # TRL's three generation paths + relax-megatron in one run; 6 steps keep continuous batching (~27 s a step)
          # inside the call's limit
          RELAX_SGLANG_PYTHONPATH=/tmp/sglsite timeout $(cap 580) python3 ci/bench_grpo_e2e.py --systems ${GRPO_SYSTEMS:-trl relax-megatron} --engine-compile \
            --steps ${GRPO_STEPS:-6} --relax-steps ${GRPO_RELAX_STEPS:-12} \
            --trl-modes ${GRPO_TRL_MODES:-default static continuous-batching} \
            --json "$OUT/bench_grpo_e2e.json" --workdir /tmp/grpo_runs 2>&1 \
            | tee "$OUT/bench_grpo_e2e.txt"
          python3 ci/run_figures.py /tmp/grpo_runs/relax-megatron --json "$OUT/grpo_relax_megatron_figures.json" \
            | tee -a "$OUT/bench_grpo_e2e.txt"
          if [ -d /tmp/grpo_runs/relax-megatron-sglang ]; then
            python3 ci/run_figures.py /tmp/grpo_runs/relax-megatron-sglang \
              --json "$OUT/grpo_relax_megatron_sglang_figures.json" | tee -a "$OUT/bench_grpo_e2e.txt"
            tail -40 /tmp/grpo_runs/relax-megatron-sglang/sglang-engine-*.log > "$OUT/grpo_sglang_engine_log_tail.txt" 2>/dev/null
          fi ;;
  esac
done
