#!/usr/bin/env bash
# Benchmark: does an offloaded run stay inside its step's memory over its whole life? Peak RSS of
# the largest rank (VmHWM: since the process started, so start-up is included) of three runs per
# offload setting, on WORLD (2) gloo ranks at bench/fsdp_vs_torch.sh's transformer size:
#   steady   STEPS steps, no checkpoint
#   saves    the same with a save every SAVE_EVERY steps (the peak read at step STEPS covers the
#            saves before it: a step's record is written before its own save)
#   resume   resumed from the saves run's last checkpoint, RESUME_STEPS more steps and their saves
# Settings (SETTINGS, space-separated):
#   swap_disk    training.optimizer adamw_swap with training.offload_dir (moments on disk)
#   shards_disk  parallel.fsdp_plan.cpu_offload with training.offload_dir (shards and moments on disk)
#   swap_host    adamw_swap on the host tier
#   none         no offload
# The last line of stdout is one JSON object: per setting the three peaks and saves / steady and
# resume / steady (target <= 1.05: a save adds at most one FSDP unit's shard and moments).
# Usage: bench/offload_save.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): bench/fsdp_vs_torch.sh's size knobs (LAYERS, HIDDEN, ...); STEPS (12),
#   SAVE_EVERY (3), RESUME_STEPS (4), SETTINGS (swap_disk shards_disk swap_host), OFFLOAD_DIR
#   (default BENCH_DIR/offload), BENCH_DIR (default BUILD_DIR/bench_offload_save).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_offload_save "${1:-build}"
require_mmtrain
OFFLOAD_DIR=${OFFLOAD_DIR:-$BENCH_DIR/offload}
STEPS=${STEPS:-12}
SAVE_EVERY=${SAVE_EVERY:-3}
RESUME_STEPS=${RESUME_STEPS:-4}
SETTINGS=${SETTINGS:-swap_disk shards_disk swap_host}
"$PY" bench/torch_fsdp2_reference.py prepare --dir "$BENCH_DIR" >&2
mkdir -p "$OFFLOAD_DIR" "$BENCH_DIR/runs"

setting_sets() {  # setting_sets SETTING: its overrides, one per line
  case "$1" in
    none) ;;
    swap_disk) printf '%s\n' --set training.optimizer=adamw_swap --set "training.offload_dir=$OFFLOAD_DIR" ;;
    shards_disk) printf '%s\n' --set parallel.fsdp_plan.cpu_offload=true --set "training.offload_dir=$OFFLOAD_DIR" ;;
    swap_host) printf '%s\n' --set training.optimizer=adamw_swap ;;
    *) echo "bench: unknown setting '$1' (SETTINGS takes: none swap_disk shards_disk swap_host)" >&2; exit 1 ;;
  esac
}
run_arm() {  # run_arm NAME ARGS...: one run into BENCH_DIR/runs/NAME, its log beside it
  run_logged "$1" "$BENCH_DIR/runs/$1" mmtrain_arm "$BENCH_DIR/runs/$1" "${@:2}"
}

for setting in $SETTINGS; do
  mapfile -t sets < <(setting_sets "$setting")
  ckpt="$BENCH_DIR/ckpt_$setting"
  rm -rf "$ckpt"
  run_arm "${setting}_steady" "${sets[@]}" --set "training.train_iters=$STEPS"
  run_arm "${setting}_saves" "${sets[@]}" --set "training.train_iters=$STEPS" --set "training.save=$ckpt" \
    --set "training.save_interval=$SAVE_EVERY"
  run_arm "${setting}_resume" "${sets[@]}" --set "training.train_iters=$((STEPS + RESUME_STEPS))" \
    --set "training.save=$ckpt" --set "training.load=$ckpt" --set "training.save_interval=$SAVE_EVERY"
done

"$PY" - "$BENCH_DIR" $SETTINGS <<'EOF'
import json, os, sys
d, settings = sys.argv[1], sys.argv[2:]
def peak(run):  # the largest rank's VmHWM, max over the run's records
    records = [json.loads(line) for line in open(os.path.join(d, "runs", run, "metrics.jsonl")) if line.strip()]
    return max(r["peak_rss_mb"] for r in records)
out = {}
for s in settings:
    steady, saves, resume = (peak(f"{s}_{arm}") for arm in ("steady", "saves", "resume"))
    out[s] = {"steady_peak_rss_mb": steady, "saves_peak_rss_mb": saves, "resume_peak_rss_mb": resume,
              "saves_over_steady": round(saves / steady, 4), "resume_over_steady": round(resume / steady, 4)}
    print(f"{s:12s} steady {steady:8.1f} MB   3 saves {saves:8.1f} MB ({saves / steady:.3f}x)   "
          f"resume + saves {resume:8.1f} MB ({resume / steady:.3f}x)", file=sys.stderr)
print(json.dumps(out))
EOF
