#!/usr/bin/env bash
# Benchmark: how well the plan predicts runs on this machine (docs/step_time.md). A profile of this
# machine from `mmtrain measure profile`; twelve configurations of bench/fsdp_vs_torch.sh's
# transformer on WORLD (2) gloo ranks, one thread each (recompute, each offload feature and the
# disk tier, HSDP, a larger micro-batch, some combined), STEPS steps each with
# logging.device_profile set, so that each run writes its prediction (plan.json) beside its
# metrics; `plan --calibrate` on the odd-numbered runs; then every configuration predicted again
# with the calibrated profile (`mmtrain plan --device`) and compared with its measured median step.
# The last line of stdout is one JSON object (bench/plan_sweep_summary.py): per run measured and
# predicted step time and peak RSS; Spearman's rank correlation of the calibrated predictions with
# the measured steps over all runs (target >= 0.8), the median absolute error over the held-out,
# even-numbered runs (target <= 20 %), and the worst measured / predicted peak RSS (target within
# 10 %).
# Usage: bench/plan_sweep.sh [BUILD_DIR]   Knobs: bench/fsdp_vs_torch.sh's size knobs, STEPS (4),
#   RUNS (space-separated names; default all twelve), BENCH_DIR (default BUILD_DIR/bench_plan_sweep).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_plan_sweep "${1:-build}"
require_mmtrain
STEPS=${STEPS:-4}
"$PY" bench/torch_fsdp2_reference.py prepare --dir "$BENCH_DIR" >&2
mkdir -p "$BENCH_DIR/runs" "$BENCH_DIR/offload"
SEQ=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['SEQ'])" "$BENCH_DIR/bench_meta.json")
PROFILE="$BENCH_DIR/local.json"
"$BIN" measure profile --out "$PROFILE" --overwrite --disk-dir "$BENCH_DIR/offload" >/dev/null

ACTIVATIONS=(--set features.enable_activation_offload=true --set 'features.activation_offload_plan.apply_modules=["layers.{*}"]')
DISK=(--set "training.offload_dir=$BENCH_DIR/offload")
run_sets() {  # run_sets NAME: its overrides, one per line
  local off=(--set features.recompute=false) on=(--set features.recompute=true)
  case "$1" in
    base) printf '%s\n' "${off[@]}" ;;
    recompute) printf '%s\n' "${on[@]}" ;;
    cpu_offload) printf '%s\n' "${off[@]}" --set parallel.fsdp_plan.cpu_offload=true ;;
    swap_host) printf '%s\n' "${off[@]}" --set training.optimizer=adamw_swap ;;
    swap_disk) printf '%s\n' "${off[@]}" --set training.optimizer=adamw_swap "${DISK[@]}" ;;
    shards_disk) printf '%s\n' "${off[@]}" --set parallel.fsdp_plan.cpu_offload=true "${DISK[@]}" ;;
    activations) printf '%s\n' "${on[@]}" "${ACTIVATIONS[@]}" ;;
    hsdp) printf '%s\n' "${off[@]}" --set parallel.fully_shard_parallel_size=1 ;;
    micro2) printf '%s\n' "${off[@]}" --set training.micro_batch_size=2 ;;
    recompute_cpu_offload) printf '%s\n' "${on[@]}" --set parallel.fsdp_plan.cpu_offload=true ;;
    micro2_recompute) printf '%s\n' "${on[@]}" --set training.micro_batch_size=2 ;;
    hsdp_recompute) printf '%s\n' "${on[@]}" --set parallel.fully_shard_parallel_size=1 ;;
    # Not in the default twelve: the other candidates `plan --auto --device-memory-gb 1.0` finds fitting
    # (docs/step_time.md, "Choosing"), measured with RUNS=... so that its pick is compared with all.
    hsdp_cpu_offload) printf '%s\n' "${off[@]}" --set parallel.fully_shard_parallel_size=1 --set parallel.fsdp_plan.cpu_offload=true ;;
    recompute_swap_host) printf '%s\n' "${on[@]}" --set training.optimizer=adamw_swap ;;
    hsdp_recompute_cpu_offload) printf '%s\n' "${on[@]}" --set parallel.fully_shard_parallel_size=1 \
                                  --set parallel.fsdp_plan.cpu_offload=true ;;
    *) echo "bench: unknown run '$1'" >&2; exit 1 ;;
  esac
}
RUNS=${RUNS:-base recompute cpu_offload swap_host swap_disk shards_disk activations hsdp micro2 recompute_cpu_offload micro2_recompute hsdp_recompute}

i=0
calibration=()
for name in $RUNS; do
  mapfile -t sets < <(run_sets "$name")
  out="$BENCH_DIR/runs/$name"
  run_logged "$name" "$out" mmtrain_arm "$out" "${sets[@]}" --set "training.train_iters=$STEPS" \
    --set "logging.device_profile=$PROFILE"
  if ((i % 2 == 0)); then calibration+=("$out"); fi  # the 1st, 3rd, ... runs calibrate; the others are held out
  i=$((i + 1))
done
rm -f "$BENCH_DIR/calibrated.json"
"$BIN" plan --calibrate "${calibration[@]}" --device "$PROFILE" --out "$BENCH_DIR/calibrated.json" --skip-first 1 |
  tail -n 1 >"$BENCH_DIR/calibration.json"
for name in $RUNS; do
  mapfile -t sets < <(run_sets "$name")
  "$BIN" plan "$BENCH_DIR/bench.yaml" --world-size "$WORLD" --seqlen "$SEQ" --device "$BENCH_DIR/calibrated.json" \
    "${sets[@]}" | tail -n 1 >"$BENCH_DIR/runs/$name.calibrated_plan.json"
done
"$PY" bench/plan_sweep_summary.py --dir "$BENCH_DIR" --runs $RUNS
