#!/usr/bin/env bash
# Benchmark: mmtrain vs PyTorch FSDP2, both on WORLD (2) gloo ranks on CPU, one intra-op thread
# per rank, same fixture and same YAML (bench/README.md). The two trainers run one after the
# other, never together. The last line of stdout is exactly the JSON object
#   {"mmtrain_step_ms":..,"torch_step_ms":..,"ratio":..,"mmtrain_rss_mb":..,"torch_rss_mb":..,"loss_rel_diff":..}
# Usage: bench/fsdp_vs_torch.sh [BUILD_DIR]      (default build; binary BUILD_DIR/bin/mmtrain,
#        or $MMTRAIN_BIN). Size knobs from the environment: STEPS WARMUP LAYERS HIDDEN HEADS
#        KV_HEADS FFN VOCAB SEQ MBS WORLD SAMPLES PARAM_DTYPE; BENCH_DIR (default BUILD_DIR/bench).
# Without a binary the torch side still runs, mmtrain fields are null and the exit status is 2.
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
ROOT=$PWD
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
PY="$ROOT/.venv/bin/python"
BIN=${MMTRAIN_BIN:-$BUILD_DIR/bin/mmtrain}
BENCH_DIR=${BENCH_DIR:-$BUILD_DIR/bench}
WORLD=${WORLD:-2}
# Every rank single-threaded on both sides: the comparison is per-core work, not thread scaling.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

mkdir -p "$BENCH_DIR"
"$PY" bench/torch_fsdp2_reference.py prepare --dir "$BENCH_DIR" >&2

status=0
if [ -x "$BIN" ]; then
  echo "bench: mmtrain on $WORLD ranks (log $BENCH_DIR/mmtrain.log)" >&2
  if ! "$PY" -m torch.distributed.run --standalone --nproc-per-node "$WORLD" --no-python \
      "$BIN" train "$BENCH_DIR/bench.yaml" >"$BENCH_DIR/mmtrain.log" 2>&1; then
    echo "bench: mmtrain failed; last lines of its log:" >&2
    tail -n 40 "$BENCH_DIR/mmtrain.log" >&2
    exit 1
  fi
else
  echo "bench: no mmtrain binary at $BIN: running the torch side only" >&2
  status=2
fi

echo "bench: PyTorch FSDP2 on $WORLD gloo ranks (log $BENCH_DIR/torch.log)" >&2
if ! "$PY" bench/torch_fsdp2_reference.py torch --dir "$BENCH_DIR" >"$BENCH_DIR/torch.log" 2>&1; then
  echo "bench: torch reference failed; last lines of its log:" >&2
  tail -n 40 "$BENCH_DIR/torch.log" >&2
  exit 1
fi

"$PY" bench/torch_fsdp2_reference.py summarize --dir "$BENCH_DIR"
exit $status
