#!/usr/bin/env bash
# Benchmark: the seed's optimization table (seed 000 §8.5) on this CPU. mmtrain trains
# bench/magihuman_vs_torch.sh's MagiHuman (same fixture, same knobs; PARAM_DTYPE defaults to bf16
# here, the seed's dtype) in three arms, interleaved over ROUNDS rounds (bench/bench_arms.sh):
#   baseline             model.config.fused_ops=false, deinterleave_mlp=false (reference ops,
#                        the checkpoint's interleaved gate/linear rows read in place)
#   fused                + fused RoPE / RMSNorm / SwiGLU7 kernels (fused_ops=true)
#   fused_deinterleaved  + the gated MLP's rows de-interleaved at load (deinterleave_mlp=true)
# The last line of stdout is one JSON object (bench/optimizations_summary.py): per arm the median
# step time, MFU against the measured GEMM peak of PARAM_DTYPE, speedup over the baseline, and the
# arm's loss curve against the baseline's.
# Usage: bench/magihuman_optimizations.sh [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
# Knobs (environment): bench/magihuman_vs_torch.sh's (STEPS, WARMUP, LAYERS, HIDDEN, HEAD_DIM, ...);
#   PARAM_DTYPE (bf16); ROUNDS (2); BENCH_DIR (default BUILD_DIR/bench_magihuman_opt).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench_magihuman_opt "${1:-build}"
require_mmtrain
export PARAM_DTYPE=${PARAM_DTYPE:-bf16}
echo "bench: fixture, weights and batches (reused while the knobs are unchanged)" >&2
"$PY" bench/torch_magihuman_fsdp.py prepare --dir "$BENCH_DIR" --mmtrain "$BIN" >&2
measure_gemm_peak

arm_command() {  # arm_command ARM OUT
  local fused=true deinterleave=true
  case "$1" in
    baseline) fused=false deinterleave=false ;;
    fused) deinterleave=false ;;
  esac
  mmtrain_arm "$2" --set "model.config.fused_ops=$fused" --set "model.config.deinterleave_mlp=$deinterleave"
}
arms=(baseline fused fused_deinterleaved)
run_rounds "${arms[@]}"

"$PY" bench/optimizations_summary.py --dir "$BENCH_DIR" --arms "${arms[@]}"
