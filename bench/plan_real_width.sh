#!/usr/bin/env bash
# Benchmark (memory, not speed): MagiHuman at its real layer width against its plan, on 2 CPU
# ranks with one thread each: one GELU7 layer at hidden 5120 (40 query / 8 key-value heads of 128),
# the seed's 4606-token packed sample (fixture default shapes), bf16 params with fp32 reduction, no
# weights (random init), 2 steps, with recompute, without it, and with recompute and cpu_offload.
# One layer is what fits 24 GiB (docs/step_time.md, "Real widths"). Each run records its own
# prediction (predicted_peak_rss_mb); the last line of stdout is one JSON object with the measured
# and predicted peaks. About 9 minutes on 2 cores, ~15 GiB of RAM.
# Usage: bench/plan_real_width.sh [BUILD_DIR]   Knobs: BENCH_DIR (default BUILD_DIR/bench_real_width).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_real_width "${1:-build}"
require_mmtrain
[ -d "$BENCH_DIR/data" ] || "$BIN" fixture magihuman --out "$BENCH_DIR/data" --samples 2 --seed 1 >/dev/null
ARMS=(recompute no_recompute recompute_cpu_offload)
for arm in "${ARMS[@]}"; do
  extra=()
  case $arm in
    no_recompute) extra=(--set features.recompute=false) ;;
    recompute_cpu_offload) extra=(--set parallel.fsdp_plan.cpu_offload=true) ;;
  esac
  out="$BENCH_DIR/runs/$arm"
  mkdir -p "$BENCH_DIR/runs"
  run_logged "$arm" "$out" "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 --no-python \
    "$BIN" train examples/magihuman/magihuman_config_t2av.yaml --set "data.dataset_param.data_root=$BENCH_DIR/data" \
    --set model.model_name_or_path= --set model.checkpoint_path= --set model.config.num_layers=1 \
    --set 'model.config.mm_layers=[]' --set 'model.config.gelu7_layers=[0]' --set training.train_iters=2 \
    --set training.save= --set "logging.output_dir=$out" "${extra[@]}"
done
"$PY" - "$BENCH_DIR" "${ARMS[@]}" <<'PYEOF'
import json, os, sys
rows = []
for arm in sys.argv[2:]:
    records = [json.loads(l) for l in open(os.path.join(sys.argv[1], "runs", arm, "metrics.jsonl")) if l.strip()]
    measured = max(r["peak_rss_mb"] for r in records)
    predicted = max(r["predicted_peak_rss_mb"] for r in records)
    rows.append({"run": arm, "peak_rss_mb": round(measured), "predicted_peak_rss_mb": round(predicted),
                 "ratio": round(measured / predicted, 3)})
    print(f"{arm:24s} {measured:8.0f} MB, predicted {predicted:8.0f} MB, ratio {measured / predicted:.3f}")
print(json.dumps({"runs": rows}))
PYEOF
