#!/usr/bin/env bash
# Benchmark: what a checkpoint costs the training loop, synchronous against asynchronous
# (training.async_save), on WORLD (2) gloo ranks on CPU, one intra-op thread per rank. Three arms
# train the same YAML: `none` (no saves), `sync` and `async` (a save every SAVE_INTERVAL steps,
# keep_latest_k 1), interleaved over ROUNDS rounds (bench/bench_arms.sh). The last line of stdout
# is one JSON object (bench/checkpoint_summary.py: stall per save iteration, staging ms and
# bytes, the ordinary step of each arm, async stall / sync stall).
# Usage: bench/checkpoint.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): MODEL (transformer: bench/fsdp_vs_torch.sh's default size, or magihuman:
#   bench/magihuman_vs_torch.sh's) and that bench's size knobs; SAVE_INTERVAL (5); ROUNDS (2);
#   ARMS (default "none sync async": a subset reruns some arms, the summary reads what is there);
#   BENCH_DIR (default BUILD_DIR/bench_checkpoint_MODEL). Checkpoints go under BENCH_DIR/runs.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
MODEL=${MODEL:-transformer}
bench_setup "bench_checkpoint_$MODEL" "${1:-build}"
require_mmtrain
SAVE_INTERVAL=${SAVE_INTERVAL:-5}
case "$MODEL" in
  transformer) "$PY" bench/torch_fsdp2_reference.py prepare --dir "$BENCH_DIR" >&2 ;;
  magihuman) "$PY" bench/torch_magihuman_fsdp.py prepare --dir "$BENCH_DIR" --mmtrain "$BIN" >&2 ;;
  *) echo "bench: MODEL must be transformer or magihuman, found '$MODEL'" >&2; exit 1 ;;
esac

arm_command() {  # arm_command ARM OUT
  local saves=(--set "training.save=$2/ckpt" --set "training.save_interval=$SAVE_INTERVAL"
               --set "training.keep_latest_k=1")
  case "$1" in
    none) mmtrain_arm "$2" --set training.save= ;;
    sync) mmtrain_arm "$2" "${saves[@]}" ;;
    async) mmtrain_arm "$2" "${saves[@]}" --set training.async_save=true ;;
  esac
}
read -r -a arms <<<"${ARMS:-none sync async}"
run_rounds "${arms[@]}"

"$PY" bench/checkpoint_summary.py --dir "$BENCH_DIR" --save-interval "$SAVE_INTERVAL"
