#!/usr/bin/env bash
# Benchmark: what the disk tier for AdamW moments (training.optimizer adamw_swap with
# training.offload_dir) costs and saves, on WORLD (2) gloo ranks on CPU, one intra-op thread per
# rank, at bench/fsdp_vs_torch.sh's default transformer size. Two arms train the same YAML: `ram`
# (moments in RAM) and `disk` (moments in OFFLOAD_DIR, streamed through RAM windows), interleaved
# over ROUNDS rounds (bench/bench_arms.sh). The last line of stdout is one JSON object
# (bench/offload_summary.py: median step time and peak RSS per arm, their ratio, RSS saved per
# parameter per rank, the disk traffic and the optimizer's wait for it).
# Usage: bench/offload.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): bench/fsdp_vs_torch.sh's size knobs (LAYERS, HIDDEN, ..., STEPS, PARAM_DTYPE);
#   ROUNDS (2); OFFLOAD_DIR (default BENCH_DIR/offload: put it on the disk you mean to measure);
#   BENCH_DIR (default BUILD_DIR/bench_offload).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_offload "${1:-build}"
[ -x "$BIN" ] || { echo "bench: no mmtrain binary at $BIN (build first: make build)" >&2; exit 1; }
OFFLOAD_DIR=${OFFLOAD_DIR:-$BENCH_DIR/offload}
mkdir -p "$OFFLOAD_DIR"
"$PY" bench/torch_fsdp2_reference.py prepare --dir "$BENCH_DIR" >&2

arm_command() {  # arm_command ARM OUT
  case "$1" in
    ram) mmtrain_arm "$2" ;;
    disk) mmtrain_arm "$2" --set training.optimizer=adamw_swap --set "training.offload_dir=$OFFLOAD_DIR" ;;
  esac
}
run_rounds ram disk

"$PY" bench/offload_summary.py --dir "$BENCH_DIR"
