#!/usr/bin/env bash
# Benchmark: mmtrain's MagiHuman against the project's PyTorch reference DiT under FSDP2
# (bench/torch_magihuman_fsdp.py), both on WORLD (2) gloo ranks on CPU, one intra-op thread per
# rank, same weights and the same collated batches. PyTorch runs fused AdamW, with and without
# tcmalloc preloaded. Arms interleaved over ROUNDS rounds (bench/bench_arms.sh). The last line
# of stdout is one JSON object, the fields of bench/fsdp_vs_torch.sh (bench/README.md).
# Usage: bench/magihuman_vs_torch.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): STEPS WARMUP LAYERS HIDDEN HEAD_DIM KV_HEADS VIDEO_GRID AUDIO_TOKENS
#   TEXT_TOKENS SAMPLES WORLD (bench/torch_magihuman_fsdp.py); ROUNDS (2); BENCH_DIR (default
#   BUILD_DIR/bench_magihuman).
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
ROOT=$PWD
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
PY="$ROOT/.venv/bin/python"
BIN=${MMTRAIN_BIN:-$BUILD_DIR/bin/mmtrain}
BENCH_DIR=${BENCH_DIR:-$BUILD_DIR/bench_magihuman}
WORLD=${WORLD:-2}
ROUNDS=${ROUNDS:-2}
TCMALLOC=${TCMALLOC:-/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

[ -x "$BIN" ] || { echo "bench: no mmtrain binary at $BIN (build first: make build)" >&2; exit 1; }
[ -f "$TCMALLOC" ] || { echo "bench: $TCMALLOC is missing (Debian libtcmalloc-minimal4; scripts/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$BENCH_DIR"
echo "bench: fixture, weights and batches (reused while the knobs are unchanged)" >&2
"$PY" bench/torch_magihuman_fsdp.py prepare --dir "$BENCH_DIR" --mmtrain "$BIN" >&2
echo "bench: GEMM peak (fp32, 1 thread)" >&2
"$BIN" measure gemm --dtype fp32 --threads 1 --repeats 5 | tail -n 1 >"$BENCH_DIR/gemm.json"

arm_command() {  # arm_command ARM OUT
  case "$1" in
    mmtrain) "$PY" -m torch.distributed.run --standalone --nproc-per-node "$WORLD" --no-python \
               "$BIN" train "$BENCH_DIR/bench.yaml" --set "logging.output_dir=$2" ;;
    torch_fused) "$PY" bench/torch_magihuman_fsdp.py torch --dir "$BENCH_DIR" --out "$2" ;;
    torch_fused_tcmalloc) LD_PRELOAD=$TCMALLOC "$PY" bench/torch_magihuman_fsdp.py torch --dir "$BENCH_DIR" --out "$2" ;;
  esac
}
. bench/bench_arms.sh
arms=(mmtrain torch_fused torch_fused_tcmalloc)
run_rounds "${arms[@]}"

"$PY" bench/bench_summary.py --dir "$BENCH_DIR" --arms "${arms[@]}"
