#!/usr/bin/env bash
# Benchmark: mmtrain vs PyTorch FSDP2, both on WORLD (2) gloo ranks on CPU, one intra-op thread
# per rank, same fixture and same YAML (bench/README.md). PyTorch runs three ways: as shipped in
# the reference (single-tensor AdamW, glibc malloc), with AdamW(fused=True), and fused with
# tcmalloc preloaded. The arms run one at a time, interleaved over ROUNDS rounds (A B C D, then
# D C B A, ...), so drift on a shared machine falls on every arm alike. The last line of stdout
# is one JSON object (fields in bench/README.md).
# Usage: bench/fsdp_vs_torch.sh [BUILD_DIR]      (default build; binary BUILD_DIR/bin/mmtrain,
#        or $MMTRAIN_BIN). Size knobs from the environment: STEPS WARMUP LAYERS HIDDEN HEADS
#        KV_HEADS FFN VOCAB SEQ MBS WORLD SAMPLES PARAM_DTYPE; ROUNDS (2); BENCH_DIR (default
#        BUILD_DIR/bench); MMTRAIN_PRELOAD=LIB adds an arm "mmtrain_preload" (mmtrain with LIB
#        in LD_PRELOAD), for allocator A/B runs.
# Without a binary the torch arms still run, mmtrain fields are null and the exit status is 2.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_arms.sh
bench_setup bench "${1:-build}"
"$PY" bench/torch_fsdp2_reference.py prepare --dir "$BENCH_DIR" >&2

status=0
arms=(torch_shipped torch_fused torch_fused_tcmalloc)
if [ -x "$BIN" ]; then
  arms=(mmtrain "${arms[@]}")
  [ -n "${MMTRAIN_PRELOAD:-}" ] && arms+=(mmtrain_preload)
  measure_gemm_peak
else
  echo "bench: no mmtrain binary at $BIN: running the torch arms only" >&2
  status=2
fi

arm_command() {  # arm_command ARM OUT
  case "$1" in
    mmtrain) mmtrain_arm "$2" ;;
    mmtrain_preload) LD_PRELOAD=$MMTRAIN_PRELOAD mmtrain_arm "$2" ;;
    torch_shipped) "$PY" bench/torch_fsdp2_reference.py torch --dir "$BENCH_DIR" --adamw single --out "$2" ;;
    torch_fused) "$PY" bench/torch_fsdp2_reference.py torch --dir "$BENCH_DIR" --adamw fused --out "$2" ;;
    torch_fused_tcmalloc) LD_PRELOAD=$TCMALLOC "$PY" bench/torch_fsdp2_reference.py torch --dir "$BENCH_DIR" \
               --adamw fused --out "$2" ;;
  esac
}
run_rounds "${arms[@]}"

"$PY" bench/bench_summary.py --dir "$BENCH_DIR" --arms "${arms[@]}"
exit $status
