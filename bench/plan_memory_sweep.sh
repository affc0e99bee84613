#!/usr/bin/env bash
# Benchmark: the plan's memory against the runs it predicts, over the knobs bench/plan_sweep.sh
# (the transformer, 2 ranks) cannot turn: MagiHuman (its real structure: GQA, modality experts,
# GELU7 and SwiGLU7 layers) at a width where the plan's bytes outweigh the runtime (hidden 384,
# 3 layers, ~1100-token packed samples with the real channel counts, fp32) on 2 and 4 gloo ranks,
# one thread each, with Ulysses, ring and hybrid context parallelism, HSDP, recompute on and off,
# and each offload feature; and tiny Magistral (vision tower and all) on 2 ranks. Each run predicts
# itself (predicted_peak_rss_mb in metrics.jsonl: the RSS before the model plus the plan's bytes,
# docs/step_time.md); the summary compares its largest peak RSS with that prediction.
# The last line of stdout is one JSON object: per run measured and predicted peak RSS and their
# ratio, and the worst ratio (target: within 10 %).
# Usage: bench/plan_memory_sweep.sh [BUILD_DIR]   Knobs: STEPS (3), RUNS (names; default all),
#   BENCH_DIR (default BUILD_DIR/bench_plan_memory).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_plan_memory "${1:-build}"
require_mmtrain
STEPS=${STEPS:-3}
DATA="$BENCH_DIR/magihuman_data"
M3_DATA="$BENCH_DIR/magistral_data"
mkdir -p "$BENCH_DIR/runs" "$BENCH_DIR/offload"
[ -d "$DATA" ] || "$BIN" fixture magihuman --out "$DATA" --samples 16 --seed 3 --video-grid 4,16,16 --audio-tokens 32 \
  --text-tokens 48 >/dev/null
[ -d "$M3_DATA" ] || "$BIN" fixture mistral3 --out "$M3_DATA" --samples 32 --seed 3 >/dev/null

MAGIHUMAN=(examples/magihuman/magihuman_tiny.yaml --set model.model_name_or_path= --set "data.dataset_param.data_root=$DATA"
           --set model.config.num_layers=3 --set model.config.hidden_size=384 --set model.config.head_dim=32
           --set model.config.num_query_groups=4 --set model.config.video_in_channels=192
           --set model.config.audio_in_channels=64 --set model.config.text_in_channels=3584
           --set 'model.config.mm_layers=[0, 2]' --set 'model.config.gelu7_layers=[0]' --set training.micro_batch_size=1)
MAGISTRAL=(examples/magistral/magistral_tiny.yaml
           --set "data.dataset_param.preprocess_parameters.model_name_or_path=$M3_DATA/tekken.json"
           --set "data.dataset_param.basic_parameters.dataset=$M3_DATA/conversations.json"
           --set model.config.freeze_vision=false)
ACTIVATIONS=(--set features.enable_activation_offload=true --set 'features.activation_offload_plan.apply_modules=["dit.block.layers.{*}"]')
run_spec() {  # run_spec NAME: "WORLD" then the config and its overrides, one per line
  local off=(--set features.recompute=false)
  case "$1" in
    w2_base) printf '%s\n' 2 "${MAGIHUMAN[@]}" "${off[@]}" ;;
    w2_recompute) printf '%s\n' 2 "${MAGIHUMAN[@]}" ;;
    w2_ulysses) printf '%s\n' 2 "${MAGIHUMAN[@]}" "${off[@]}" --set parallel.ulysses_parallel_size=2 ;;
    w2_ring) printf '%s\n' 2 "${MAGIHUMAN[@]}" "${off[@]}" --set parallel.ring_attention_size=2 ;;
    w2_cpu_offload) printf '%s\n' 2 "${MAGIHUMAN[@]}" "${off[@]}" --set parallel.fsdp_plan.cpu_offload=true ;;
    w2_swap_disk) printf '%s\n' 2 "${MAGIHUMAN[@]}" "${off[@]}" --set training.optimizer=adamw_swap \
                    --set "training.offload_dir=$BENCH_DIR/offload" ;;
    w2_activations) printf '%s\n' 2 "${MAGIHUMAN[@]}" "${ACTIVATIONS[@]}" ;;
    w4_base) printf '%s\n' 4 "${MAGIHUMAN[@]}" "${off[@]}" ;;
    w4_recompute) printf '%s\n' 4 "${MAGIHUMAN[@]}" ;;
    w4_hsdp) printf '%s\n' 4 "${MAGIHUMAN[@]}" "${off[@]}" --set parallel.fully_shard_parallel_size=2 ;;
    w4_ulysses4) printf '%s\n' 4 "${MAGIHUMAN[@]}" "${off[@]}" --set parallel.ulysses_parallel_size=4 ;;
    w4_ring4) printf '%s\n' 4 "${MAGIHUMAN[@]}" --set parallel.ring_attention_size=4 ;;
    w4_hybrid) printf '%s\n' 4 "${MAGIHUMAN[@]}" "${off[@]}" --set parallel.ulysses_parallel_size=2 \
                 --set parallel.ring_attention_size=2 ;;
    w2_magistral) printf '%s\n' 2 "${MAGISTRAL[@]}" ;;
    w2_magistral_no_recompute) printf '%s\n' 2 "${MAGISTRAL[@]}" "${off[@]}" ;;
    *) echo "bench: unknown run '$1'" >&2; exit 1 ;;
  esac
}
RUNS=${RUNS:-w2_base w2_recompute w2_ulysses w2_ring w2_cpu_offload w2_swap_disk w2_activations w4_base w4_recompute w4_hsdp w4_ulysses4 w4_ring4 w4_hybrid w2_magistral w2_magistral_no_recompute}

for name in $RUNS; do
  mapfile -t spec < <(run_spec "$name")
  out="$BENCH_DIR/runs/$name"
  run_logged "$name" "$out" "$PY" -m torch.distributed.run --standalone --nproc-per-node "${spec[0]}" --no-python \
    "$BIN" train "${spec[@]:1}" --set "logging.output_dir=$out" --set "training.train_iters=$STEPS" \
    --set training.save=
done
"$PY" - "$BENCH_DIR" $RUNS <<'PYEOF'
import json, os, sys
bench_dir, runs = sys.argv[1], sys.argv[2:]
rows = []
for name in runs:
    records = [json.loads(l) for l in open(os.path.join(bench_dir, "runs", name, "metrics.jsonl")) if l.strip()]
    measured = max(r["peak_rss_mb"] for r in records)
    predicted = max(r["predicted_peak_rss_mb"] for r in records)
    rows.append({"run": name, "peak_rss_mb": round(measured, 1), "predicted_peak_rss_mb": round(predicted, 1),
                 "ratio": round(measured / predicted, 3)})
print(f"{'run':28s} {'peak RSS MB':>12s} {'predicted':>10s} {'ratio':>7s}")
for r in rows:
    print(f"{r['run']:28s} {r['peak_rss_mb']:12.1f} {r['predicted_peak_rss_mb']:10.1f} {r['ratio']:7.3f}")
worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
within = sum(abs(r["ratio"] - 1) <= 0.10 for r in rows)
print(f"worst ratio {worst['ratio']} ({worst['run']}); {within} of {len(rows)} within 10 %")
print(json.dumps({"runs": rows, "worst_ratio": worst["ratio"], "worst_run": worst["run"], "within_10pct": within}))
PYEOF
