#!/usr/bin/env bash
# The seed's feature comparison for context parallelism, on CPU: tiny-width MagiHuman (hidden 128,
# 4 layers, 4 q / 2 KV heads) on one packed sample of 4192 tokens per micro-batch, 2 ranks x 1
# thread, 20 steps each at the same global batch (2) and sample order:
#   control   FSDP over 2 ranks, data-parallel 2 (one sample per rank)
#   control2  the same again: the noise floor of the comparison
#   ulysses2  Ulysses 2: data-parallel 1, 2 micro-batches per step, each split over the 2 ranks
#   ring2     ring attention 2, likewise
# For each against the control: the normalized loss difference sum|a-b|/sum|b| (`mmtrain logs
# compare`), the change of the peak RSS (max over ranks) and of the median step time after 5
# warm-up steps. Usage: bench/cp_compare.sh [WORKDIR]   binary: $MMTRAIN_BIN, else build/bin/mmtrain
# Prints a table, then one JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cp_common.sh "${1:-}"
config() {  # name parallel accum
  cat > "$work/$1.yaml" <<YAML
parallel:
  $2
  fsdp_plan: {apply_modules: ["dit.block.layers.{*}"]}
model: {model_id: magihuman, model_name_or_path: $work/base, config: $model}
data:
  dataset_param: {dataset_type: magihuman_precomputed, data_root: $work/data}
  dataloader_param: {collate_param: {model_name: magihuman}}
features: {recompute: true, recompute_plan: {apply_modules: ["dit.block.layers.{*}"]}}
training: {micro_batch_size: 1, gradient_accumulation_steps: $3, train_iters: 20, lr: 1.0e-3, clip_grad: 1.0}
logging: {output_dir: $work/$1, progress: false}
YAML
}

if [[ ! -d $work/data ]]; then
  "$bin" fixture magihuman --out "$work/data" --samples 40 --seed 2 --video-grid 4,32,32 --audio-tokens 64 \
    --text-tokens 32 --video-channels 16 --audio-channels 8 --text-channels 24 > /dev/null
  config weights "" 1
  "$bin" fixture magihuman-weights --config "$work/weights.yaml" --out "$work/base" --shards 2 > /dev/null
fi
config control "fully_shard_parallel_size: auto" 1
config control2 "fully_shard_parallel_size: auto" 1
config ulysses2 "ulysses_parallel_size: 2" 2
config ring2 "ring_attention_size: 2" 2
port=29571
for name in control ulysses2 ring2 control2; do
  rm -rf "$work/$name/metrics.jsonl"
  "$torchrun" --nproc-per-node 2 --master-port $((port++)) --no-python "$bin" train "$work/$name.yaml" \
    > "$work/$name.log" 2>&1 || { tail -20 "$work/$name.log" >&2; exit 1; }
done

"$PWD/.venv/bin/python" - "$work" "$bin" <<'PYEOF'
import json, statistics, subprocess, sys
from pathlib import Path
work, binary = Path(sys.argv[1]), sys.argv[2]
def metrics(name):
    return [json.loads(l) for l in open(work / name / "metrics.jsonl") if l.strip()]
control = metrics("control")
peak = lambda m: max(r["peak_rss_mb"] for r in m)
step = lambda m: statistics.median(r["step_time_ms"] for r in m[5:])
result = {"bench": "cp_compare", "model": "magihuman hidden 128, 4 layers", "tokens_per_sample": 4192, "ranks": 2,
          "steps": len(control), "control_step_ms": round(step(control), 1), "control_peak_rss_mb": round(peak(control), 1)}
print(f"{'run':10} {'loss diff':>10} {'peak RSS':>10} {'RSS change':>11} {'step ms':>9} {'step change':>12}")
for name in ("control2", "ulysses2", "ring2"):
    m = metrics(name)
    cmp = json.loads(subprocess.run([binary, "logs", "compare", str(work / name / "metrics.jsonl"),
                                     str(work / "control" / "metrics.jsonl"), "--skip-first", "5"],
                                    capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    row = {"loss_rel_diff": cmp["loss_rel_diff"], "peak_rss_mb": round(peak(m), 1),
           "peak_rss_change_mb": round(peak(m) - peak(control), 1), "step_ms": round(step(m), 1),
           "step_time_change": round(step(m) / step(control) - 1, 4)}
    result[name] = row
    print(f"{name:10} {row['loss_rel_diff']:10.2e} {row['peak_rss_mb']:9.1f}M {row['peak_rss_change_mb']:+10.1f}M "
          f"{row['step_ms']:9.1f} {100 * row['step_time_change']:+11.2f}%")
print(json.dumps(result))
PYEOF
