#!/usr/bin/env bash
# Benchmark: what each offload feature costs and saves, on WORLD (2) gloo ranks on CPU, one
# intra-op thread per rank, at bench/fsdp_vs_torch.sh's default transformer size with recompute on
# (the seeds' setting, which activation offload builds on) and tools.memory_profile on in every arm.
# Arms, interleaved over ROUNDS rounds (bench/bench_arms.sh), all training the same YAML:
#   none         no offload
#   activations  features.enable_activation_offload on every layer
#   cpu_offload  parallel.fsdp_plan.cpu_offload
#   swap_host    training.optimizer adamw_swap (moments in the host tier)
#   disk         adamw_swap with training.offload_dir=OFFLOAD_DIR (moments on disk)
#   shards_disk  cpu_offload with training.offload_dir (shards and moments on disk)
#   all_three    activations + cpu_offload + disk (shards and moments on disk)
# The planner's per-rank device / host / disk bytes for each arm come from `mmtrain plan` with the
# same overrides. The last line of stdout is one JSON object (bench/offload_summary.py).
# Usage: bench/offload.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): bench/fsdp_vs_torch.sh's size knobs (LAYERS, HIDDEN, ..., STEPS, PARAM_DTYPE);
#   ROUNDS (2); ARMS (space-separated; default all but shards_disk); RECOMPUTE (true; the activations arms need it);
#   OFFLOAD_DIR (default BENCH_DIR/offload: put it on
#   the disk you mean to measure); BENCH_DIR (default BUILD_DIR/bench_offload).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_offload "${1:-build}"
require_mmtrain
OFFLOAD_DIR=${OFFLOAD_DIR:-$BENCH_DIR/offload}
ARMS=${ARMS:-none activations cpu_offload swap_host disk all_three}
RECOMPUTE=${RECOMPUTE:-true}
mkdir -p "$OFFLOAD_DIR"
"$PY" bench/torch_fsdp2_reference.py prepare --dir "$BENCH_DIR" >&2

COMMON=(--set "features.recompute=$RECOMPUTE" --set tools.memory_profile.enable=true)
arm_sets() {  # arm_sets ARM: the overrides of one arm
  local activations=(--set features.enable_activation_offload=true --set 'features.activation_offload_plan.apply_modules=["layers.{*}"]')
  local disk=(--set training.optimizer=adamw_swap --set "training.offload_dir=$OFFLOAD_DIR")
  case "$1" in
    none) ;;
    activations) printf '%s\n' "${activations[@]}" ;;
    cpu_offload) printf '%s\n' --set parallel.fsdp_plan.cpu_offload=true ;;
    swap_host) printf '%s\n' --set training.optimizer=adamw_swap ;;
    disk) printf '%s\n' "${disk[@]}" ;;
    shards_disk) printf '%s\n' --set parallel.fsdp_plan.cpu_offload=true --set "training.offload_dir=$OFFLOAD_DIR" ;;
    all_three) printf '%s\n' "${activations[@]}" --set parallel.fsdp_plan.cpu_offload=true "${disk[@]}" ;;
    *) echo "bench: unknown arm '$1' (ARMS takes: none activations cpu_offload swap_host disk shards_disk all_three)" >&2; exit 1 ;;
  esac
}
arm_command() {  # arm_command ARM OUT
  local sets
  mapfile -t sets < <(arm_sets "$1")
  mmtrain_arm "$2" "${COMMON[@]}" "${sets[@]}"
}

mkdir -p "$BENCH_DIR/plans"
SEQ=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['SEQ'])" "$BENCH_DIR/bench_meta.json")
for arm in $ARMS; do
  mapfile -t sets < <(arm_sets "$arm")
  "$BIN" plan "$BENCH_DIR/bench.yaml" --world-size "$WORLD" --seqlen "$SEQ" "${COMMON[@]}" "${sets[@]}" | tail -n 1 >"$BENCH_DIR/plans/$arm.json"
done
# shellcheck disable=SC2086
run_rounds $ARMS

"$PY" bench/offload_summary.py --dir "$BENCH_DIR" --arms $ARMS
