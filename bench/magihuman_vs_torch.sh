#!/usr/bin/env bash
# Benchmark: mmtrain's MagiHuman against the project's PyTorch reference DiT under FSDP2
# (bench/torch_magihuman_fsdp.py), both on WORLD (2) gloo ranks on CPU, one intra-op thread per
# rank, same weights and the same collated batches. PyTorch runs fused AdamW, with and without
# tcmalloc preloaded. Arms interleaved over ROUNDS rounds (bench/bench_arms.sh). The last line
# of stdout is one JSON object, the fields of bench/fsdp_vs_torch.sh (bench/README.md).
# Usage: bench/magihuman_vs_torch.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): STEPS WARMUP LAYERS HIDDEN HEAD_DIM KV_HEADS VIDEO_GRID AUDIO_TOKENS
#   TEXT_TOKENS SAMPLES WORLD PARAM_DTYPE (fp32 | bf16: bf16 gathers, fp32 reduce and shards)
#   (bench/torch_magihuman_fsdp.py); ROUNDS (2); BENCH_DIR (default
#   BUILD_DIR/bench_magihuman).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_magihuman "${1:-build}"
require_mmtrain
echo "bench: fixture, weights and batches (reused while the knobs are unchanged)" >&2
"$PY" bench/torch_magihuman_fsdp.py prepare --dir "$BENCH_DIR" --mmtrain "$BIN" >&2
measure_gemm_peak

arm_command() {  # arm_command ARM OUT
  case "$1" in
    mmtrain) mmtrain_arm "$2" ;;
    torch_fused) "$PY" bench/torch_magihuman_fsdp.py torch --dir "$BENCH_DIR" --out "$2" ;;
    torch_fused_tcmalloc) LD_PRELOAD=$TCMALLOC "$PY" bench/torch_magihuman_fsdp.py torch --dir "$BENCH_DIR" --out "$2" ;;
  esac
}
arms=(mmtrain torch_fused torch_fused_tcmalloc)
run_rounds "${arms[@]}"

"$PY" bench/bench_summary.py --dir "$BENCH_DIR" --arms "${arms[@]}"
