#!/usr/bin/env bash
# Benchmark: fixed-size micro-batches against token-budget micro-batches balanced over the
# data-parallel ranks (data.dataloader_param.micro_batch_tokens, balance_dp) on ragged data, on
# WORLD (2) gloo ranks with one intra-op thread each (more ranks than cores would hide the
# imbalance: a waiting rank frees its core). Every arm reads the same global batches (GLOBAL
# samples per step, the same stream positions); arms, interleaved over ROUNDS rounds
# (bench/bench_arms.sh):
#   fixed          micro_batch_size 1, gradient accumulation GLOBAL / WORLD (the control)
#   fixed_wide     micro_batch_size GLOBAL / WORLD, no accumulation (the fewest micro-batches a fixed
#                  size allows: Magistral's rows padded to the longest, MagiHuman's packed)
#   in_order       micro_batch_tokens BUDGET, balance_dp false (packing alone: bins by first-fit decreasing, dealt round-robin)
#   balanced       micro_batch_tokens BUDGET, balance_dp true
#   fixed_repeat   the control again: the noise floor of the comparison
# for MODEL magihuman (a `fixture magihuman --mix` set: 4 durations x 3 resolutions, tokens spanning
# ~30x) or mistral3 (`fixture mistral3 --mix`: 0-4 images of two sizes, prompts of 0-60 filler words).
# The last line of stdout is one JSON object (bench/token_budget_summary.py): per arm the median step
# time, comm_wait (max over ranks), work / compute imbalance, the perfect-balance bound, budget fill
# and micro-batches per rank, and each arm's gains over the two fixed-size arms.
# Usage: bench/token_budget.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): MODEL (magihuman | mistral3); STEPS (10); WARMUP (2); GLOBAL (8); BUDGET
#   (magihuman 4096, mistral3 1024); SAMPLES (64); ROUNDS (2); ARMS (default all five);
#   BENCH_DIR (default BUILD_DIR/bench_token_budget_MODEL).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
MODEL=${MODEL:-magihuman}
bench_setup "bench_token_budget_$MODEL" "${1:-build}"
require_mmtrain
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-2}
GLOBAL=${GLOBAL:-8}
SAMPLES=${SAMPLES:-64}
ARMS=${ARMS:-fixed fixed_wide in_order balanced fixed_repeat}
DATA="$BENCH_DIR/data"

case "$MODEL" in
  magihuman) BUDGET=${BUDGET:-4096} ;;
  mistral3) BUDGET=${BUDGET:-1024} ;;
  *) echo "bench: MODEL must be magihuman or mistral3, found '$MODEL'" >&2; exit 1 ;;
esac
# The bench-size model and its fixture set: bench/bench_models.py, shared with the Python benches.
if [ ! -d "$DATA" ]; then
  mapfile -t fixture < <("$PY" bench/bench_models.py fixture "$MODEL" "$DATA" "$SAMPLES")
  "$BIN" "${fixture[@]}" >&2
fi
"$PY" bench/bench_models.py config "$MODEL" "$DATA" "$BENCH_DIR/unused" "$STEPS" "$GLOBAL" >"$BENCH_DIR/bench.yaml"
"$PY" -c "import json,sys; json.dump(dict(MODEL=sys.argv[1], STEPS=int(sys.argv[2]), WARMUP=int(sys.argv[3]),
  GLOBAL=int(sys.argv[4]), BUDGET=int(sys.argv[5]), WORLD=int(sys.argv[6]), SAMPLES=int(sys.argv[7])), open(sys.argv[8], 'w'))" \
  "$MODEL" "$STEPS" "$WARMUP" "$GLOBAL" "$BUDGET" "$WORLD" "$SAMPLES" "$BENCH_DIR/bench_meta.json"

arm_command() {  # arm_command ARM OUT
  case "$1" in
    fixed | fixed_repeat) mmtrain_arm "$2" ;;
    fixed_wide) mmtrain_arm "$2" --set "training.micro_batch_size=$((GLOBAL / WORLD))" ;;
    in_order) mmtrain_arm "$2" --set "data.dataloader_param.micro_batch_tokens=$BUDGET" --set data.dataloader_param.balance_dp=false ;;
    balanced) mmtrain_arm "$2" --set "data.dataloader_param.micro_batch_tokens=$BUDGET" ;;
    *) echo "bench: unknown arm '$1' (ARMS takes: fixed fixed_wide in_order balanced fixed_repeat)" >&2; exit 1 ;;
  esac
}
# shellcheck disable=SC2086
run_rounds $ARMS

"$PY" bench/token_budget_summary.py --dir "$BENCH_DIR" --arms $ARMS
