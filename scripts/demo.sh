#!/usr/bin/env bash
# The demo: tiny MagiHuman (the 15B model's structure at toy width) end to end on 2 CPU ranks.
#   1. synthetic precomputed data and random weights in the public HF layout (fixtures)
#   2. this CPU's GEMM FLOP/s, the stand-in for a device peak in MFU
#   3. 2-rank FSDP training through torchrun, with recompute and checkpoints
#   4. export of the final checkpoint back to the HF layout
#   5. loss, step time, TFLOP/s and MFU from the run's metrics.jsonl, and its figure (logs plot)
# then tiny Magistral (Mistral3: Pixtral + projector + Mistral LM) on generated image-text
# conversations: chat template, image pipeline, pixtral collator, 2-rank training.
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
BIN="$PWD/$BUILD_DIR/bin/mmtrain"
PY="$PWD/.venv/bin/python"
RUN=runs/magihuman_tiny
CONFIG=examples/magihuman/magihuman_tiny.yaml
rm -rf "$RUN"

"$BIN" fixture magihuman --out "$RUN/data" --samples 32 --seed 1 --video-grid 2,4,6 --audio-tokens 13 \
  --text-tokens 10 --video-channels 16 --audio-channels 8 --text-channels 24
"$BIN" fixture magihuman-weights --config "$CONFIG" --out "$RUN/base" --shards 3

peak=$("$BIN" measure gemm --threads 1 --size 1024 | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["gemm_flops"])')
echo "demo: one rank's fp32 GEMM reaches $peak FLOP/s on this CPU (used as the MFU peak)"

OMP_NUM_THREADS=1 "$PWD/.venv/bin/torchrun" --nproc-per-node 2 --master-port 29531 --no-python \
  "$BIN" train "$CONFIG" --set logging.hardware_flops="$peak"

"$BIN" convert magihuman ckpt-to-hf --load_dir "$RUN/checkpoints" --save_dir "$RUN/export" --model_assets_dir "$RUN/base"

"$BIN" logs summary "$RUN/metrics.jsonl" | tail -n 1 > "$RUN/summary.json"  # its last line is the JSON
"$BIN" logs plot "$RUN" --out "$RUN/plot.png" --title "tiny MagiHuman, 2 CPU ranks"
"$PY" - "$RUN/summary.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"demo: {s['iterations']} iterations, loss {s['loss_last']:.4f} (zero-prediction baseline 4.0), "
      f"median step {s['step_time_ms']['median']:.1f} ms, {s['tflops_per_device_median'] * 1e3:.2f} GFLOP/s per rank, "
      f"MFU {100 * s['mfu_median']:.1f} % of this CPU's GEMM")
PYEOF
echo "demo: checkpoints in $RUN/checkpoints, HF export in $RUN/export, figure $RUN/plot.png"

M3_RUN=runs/magistral_tiny
rm -rf "$M3_RUN"
"$BIN" fixture mistral3 --out "$M3_RUN/data" --samples 64 --seed 1 --bad-records
OMP_NUM_THREADS=1 "$PWD/.venv/bin/torchrun" --nproc-per-node 2 --master-port 29532 --no-python \
  "$BIN" train examples/magistral/magistral_tiny.yaml --set logging.hardware_flops="$peak"
"$BIN" logs summary "$M3_RUN/metrics.jsonl" | tail -n 1 > "$M3_RUN/summary.json"
"$BIN" logs plot "$M3_RUN" --out "$M3_RUN/plot.png" --title "tiny Magistral, 2 CPU ranks"
"$PY" - "$M3_RUN/metrics.jsonl" "$M3_RUN/summary.json" <<'PYEOF'
import json, sys
losses = [json.loads(line)["loss"] for line in open(sys.argv[1]) if line.strip()]
s = json.load(open(sys.argv[2]))
print(f"demo: magistral tiny, {len(losses)} iterations, loss {sum(losses[:10]) / 10:.3f} (first 10) -> "
      f"{sum(losses[-10:]) / 10:.3f} (last 10), median step {s['step_time_ms']['median']:.1f} ms, "
      f"MFU {100 * s['mfu_median']:.1f} % of this CPU's GEMM")
PYEOF
