#!/usr/bin/env bash
# The demo: synthetic token data, then 2-rank FSDP training of the engine's test model through
# torchrun (recompute on, gradient accumulation 2, checkpoints every 20 steps), then a resume
# check that reads the checkpoint back.
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
BIN="$PWD/$BUILD_DIR/bin/mmtrain"
TORCHRUN="$PWD/.venv/bin/torchrun"
rm -rf runs/demo
"$BIN" fixture tokens --out runs/demo/tokens.safetensors --samples 512 --seq-len 65 --vocab 128 --seed 1 --learnable
OMP_NUM_THREADS=1 "$TORCHRUN" --nproc-per-node 2 --master-port 29531 --no-python \
  "$BIN" train examples/test_transformer/tiny.yaml
echo "demo: metrics in runs/demo/metrics.jsonl, checkpoints in runs/demo/checkpoints ($(cat runs/demo/checkpoints/latest))"
