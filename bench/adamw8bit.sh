#!/usr/bin/env bash
# Benchmark: training.optimizer adamw8bit against AdamW (issue 69; docs/optimizer.md). MagiHuman
# at bench/torch_magihuman_fsdp.py's compute-dominated shape, full fine-tuning, on WORLD (2) gloo
# ranks, one intra-op thread each, the same weights and collated batches for every arm.
# Arms, interleaved over ROUNDS rounds (bench/bench_arms.sh):
#   adamw          mmtrain, fused AdamW (training.optimizer adamw)
#   adamw8bit      mmtrain, bitsandbytes' blockwise 8-bit AdamW (training.optimizer adamw8bit)
#   adamw8bit_disk the same with its state on the disk tier (training.offload_dir BENCH_DIR/offload)
#   adamw_control  mmtrain AdamW again: its spread against adamw is the noise floor
#   torch_fused    PyTorch FSDP2 + torch.optim.AdamW(fused=True)
#   torch_bnb8bit  PyTorch FSDP2 + bnb.optim.AdamW8bit over each rank's shards
# Reported: each arm's median step and (mmtrain) optimizer-phase times and peak RSS; the ratios
# adamw8bit / adamw (target: step <= 1.15), control / adamw, adamw8bit / torch_bnb8bit,
# adamw8bit_disk / adamw8bit; and the
# optimizer state in bytes per trained parameter from `mmtrain plan` (target <= 2.1; AdamW 8).
# Usage: bench/adamw8bit.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): those of bench/torch_magihuman_fsdp.py, ROUNDS (2), BENCH_DIR (default
# BUILD_DIR/bench_adamw8bit). The last line of stdout is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_adamw8bit "${1:-build}"
require_mmtrain
echo "bench: fixture, weights and batches (reused while the knobs are unchanged)" >&2
"$PY" bench/torch_magihuman_fsdp.py prepare --dir "$BENCH_DIR" --mmtrain "$BIN" >&2

arm_command() {  # arm_command ARM OUT
  case "$1" in
    adamw | adamw_control) mmtrain_arm "$2" ;;
    adamw8bit) mmtrain_arm "$2" --set training.optimizer=adamw8bit ;;
    adamw8bit_disk) mkdir -p "$BENCH_DIR/offload"
      mmtrain_arm "$2" --set training.optimizer=adamw8bit --set training.offload_dir="$BENCH_DIR/offload" ;;
    torch_fused) "$PY" bench/torch_magihuman_fsdp.py torch --dir "$BENCH_DIR" --out "$2" ;;
    torch_bnb8bit) OPTIMIZER=bnb8bit "$PY" bench/torch_magihuman_fsdp.py torch --dir "$BENCH_DIR" --out "$2" ;;
  esac
}
arms=(adamw adamw8bit adamw8bit_disk adamw_control torch_fused torch_bnb8bit)
run_rounds "${arms[@]}"
for optimizer in adamw adamw8bit; do
  "$BIN" plan "$BENCH_DIR/bench.yaml" --world_size "$WORLD" --set training.optimizer=$optimizer | tail -n 1 \
    >"$BENCH_DIR/plan_$optimizer.json"
done
"$PY" - "$BENCH_DIR" "${arms[@]}" <<'PY'
import json, os, statistics, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "parity"))
import mmtrain_util as mu
d, arms = sys.argv[1], sys.argv[2:]
warmup = json.load(open(os.path.join(d, "bench_meta.json")))["WARMUP"]
med = {}
for arm in arms:
    runs = sorted(n for n in os.listdir(os.path.join(d, "runs")) if n.startswith(arm + "_r") and n[len(arm) + 2:].isdigit())
    records = [m for n in runs for m in mu.read_metrics(os.path.join(d, "runs", n, "metrics.jsonl")) if m["iteration"] > warmup]
    med[arm] = {"step_ms": round(statistics.median(m["step_time_ms"] for m in records), 1),
                "peak_rss_mb": round(max(m["peak_rss_mb"] for m in records), 1)}
    if "phases_ms" in records[0]:
        med[arm]["optimizer_ms"] = round(statistics.median(m["phases_ms"]["optimizer"] for m in records), 1)
plans = {o: json.load(open(os.path.join(d, f"plan_{o}.json"))) for o in ("adamw", "adamw8bit")}
per_param = {o: round(p["optimizer_bytes"] * p["fsdp_size"] / p["trainable_params"], 3) for o, p in plans.items()}
ratio = lambda a, b, k="step_ms": round(med[a][k] / med[b][k], 3)
out = {"bench": "adamw8bit", "arms": med, "state_bytes_per_param": per_param,
       "adamw8bit_over_adamw": {"step_ms": ratio("adamw8bit", "adamw"), "optimizer_ms": ratio("adamw8bit", "adamw", "optimizer_ms"),
                                "peak_rss_mb": ratio("adamw8bit", "adamw", "peak_rss_mb")},
       "adamw8bit_disk_over_adamw8bit": {"step_ms": ratio("adamw8bit_disk", "adamw8bit"),
                                         "optimizer_ms": ratio("adamw8bit_disk", "adamw8bit", "optimizer_ms"),
                                         "peak_rss_mb": ratio("adamw8bit_disk", "adamw8bit", "peak_rss_mb")},
       "control_over_adamw": {"step_ms": ratio("adamw_control", "adamw"), "optimizer_ms": ratio("adamw_control", "adamw", "optimizer_ms")},
       "adamw8bit_over_torch_bnb8bit": ratio("adamw8bit", "torch_bnb8bit"),
       "torch_bnb8bit_over_torch_fused": ratio("torch_bnb8bit", "torch_fused"),
       "targets": {"step_ms": 1.15, "state_bytes_per_param": 2.1}}
print(json.dumps(out))
PY
