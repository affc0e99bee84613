#!/usr/bin/env bash
# Per-rank peak memory under context parallelism, measured and planned: tiny-width MagiHuman (the
# cp_compare.sh model) on one sample of 16,416 tokens (video 16x32x32, 16 audio, 16 text), ring
# attention over CP = 1, 2, 4 ranks (one thread each; 4 ranks share 2 cores here, which slows but
# does not change memory), 1 step with recompute (the peak is reached in the first). Each layout also runs on a 48-token sample:
# the difference of the two peak RSS (VmHWM, max over ranks) is the memory the long sequence
# costs, next to the same difference of `mmtrain plan`'s per-rank totals (activations and CP
# buffers; the plan leaves out allocator slack and the runtime, which the subtraction removes).
# Usage: bench/cp_memory.sh [WORKDIR]   binary: $MMTRAIN_BIN, else build/bin/mmtrain. One JSON line last.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cp_common.sh "${1:-}"
config() {  # name data ring
  cat > "$work/$1.yaml" <<YAML
parallel:
  ring_attention_size: $3
  fsdp_plan: {apply_modules: ["dit.block.layers.{*}"]}
model: {model_id: magihuman, model_name_or_path: $work/base, config: $model}
data:
  dataset_param: {dataset_type: magihuman_precomputed, data_root: $work/$2}
  dataloader_param: {collate_param: {model_name: magihuman}}
features: {recompute: true, recompute_plan: {apply_modules: ["dit.block.layers.{*}"]}}
training: {micro_batch_size: 1, train_iters: 1, lr: 1.0e-3}
logging: {output_dir: $work/$1, progress: false}
YAML
}
fixture() {  # dir grid
  [[ -d $work/$1 ]] || "$bin" fixture magihuman --out "$work/$1" --samples 1 --video-grid "$2" --audio-tokens 16 \
    --text-tokens 16 --video-channels 16 --audio-channels 8 --text-channels 24 > /dev/null
}
fixture long 16,32,32
fixture short 1,2,8
if [[ ! -d $work/base ]]; then
  config weights long 1
  "$bin" fixture magihuman-weights --config "$work/weights.yaml" --out "$work/base" --shards 2 > /dev/null
fi
port=29581
for cp in 1 2 4; do
  for data in long short; do
    name=cp${cp}_$data
    config "$name" "$data" "$cp"
    rm -f "$work/$name/metrics.jsonl"
    if ((cp == 1)); then "$bin" train "$work/$name.yaml" > "$work/$name.log" 2>&1
    else "$torchrun" --nproc-per-node $cp --master-port $((port++)) --no-python "$bin" train "$work/$name.yaml" \
      > "$work/$name.log" 2>&1; fi || { tail -20 "$work/$name.log" >&2; exit 1; }
    seqlen=$([[ $data == long ]] && echo 16416 || echo 48)
    "$bin" plan "$work/$name.yaml" --world-size $cp --seqlen $seqlen | tail -1 > "$work/$name.plan.json"
  done
done

"$PWD/.venv/bin/python" - "$work" <<'PYEOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
rss = lambda n: max(json.loads(l)["peak_rss_mb"] for l in open(work / n / "metrics.jsonl") if l.strip())
plan = lambda n: json.loads((work / f"{n}.plan.json").read_text())["total_bytes"] / 2**20
result = {"bench": "cp_memory", "tokens": 16416, "layers": 4, "hidden": 128}
print(f"{'cp':>3} {'peak RSS long':>14} {'short':>8} {'long - short':>13} {'plan long - short':>18} {'plan tokens/rank':>17}")
for cp in (1, 2, 4):
    measured = rss(f"cp{cp}_long") - rss(f"cp{cp}_short")
    planned = plan(f"cp{cp}_long") - plan(f"cp{cp}_short")
    tokens = json.loads((work / f"cp{cp}_long.plan.json").read_text())["tokens"]
    result[f"cp{cp}"] = {"peak_rss_mb": round(rss(f"cp{cp}_long"), 1), "short_peak_rss_mb": round(rss(f"cp{cp}_short"), 1),
                         "sequence_mb": round(measured, 1), "plan_sequence_mb": round(planned, 1), "tokens_per_rank": tokens}
    print(f"{cp:3} {rss(f'cp{cp}_long'):13.1f}M {rss(f'cp{cp}_short'):7.1f}M {measured:12.1f}M {planned:17.1f}M {tokens:17}")
print(json.dumps(result))
PYEOF
