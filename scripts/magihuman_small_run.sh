#!/usr/bin/env bash
# The convergence evidence run of docs/magihuman.md: the small MagiHuman config (8 layers,
# width 256, bf16 FSDP params, recompute) for 300 steps on 2 CPU ranks, with MFU measured
# against this CPU's own GEMM FLOP/s. Prints the summary JSON last.
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
BIN="$PWD/$BUILD_DIR/bin/mmtrain"
PY="$PWD/.venv/bin/python"
RUN=runs/magihuman_small
CONFIG=examples/magihuman/magihuman_small.yaml
rm -rf "$RUN"
"$BIN" fixture magihuman --out "$RUN/data" --samples 64 --seed 7 --video-grid 4,4,6 --audio-tokens 25 \
  --text-tokens 32 --video-channels 64 --audio-channels 16 --text-channels 128
"$BIN" fixture magihuman-weights --config "$CONFIG" --out "$RUN/base" --shards 2
peak=$("$BIN" measure gemm --threads 1 --size 1024 --dtype bf16 | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["gemm_flops"])')
OMP_NUM_THREADS=1 "$PWD/.venv/bin/torchrun" --nproc-per-node 2 --master-port 29533 --no-python \
  "$BIN" train "$CONFIG" --set logging.hardware_flops="$peak" "${@:2}"
echo "bf16 GEMM peak per rank: $peak FLOP/s"
"$BIN" logs summary "$RUN/metrics.jsonl" --skip-first 5
