#!/usr/bin/env bash
# Times `mmtrain debug step` (one MagiHuman forward + backward in one process) with
# model.config.fused_ops on and off, on a config and a collated batch you provide: e.g. the tiny
# model the parity test writes (tests/parity/test_magihuman_parity.py, under pytest's basetemp:
# magihuman_tiny.yaml and batch.safetensors), or a batch from
#   mmtrain debug collate CONFIG --out batch.safetensors --step 0
# Usage: bench/fused_ops.sh CONFIG BATCH [REPEATS]     binary: $MMTRAIN_BIN, else build/bin/mmtrain
# Prints the best wall time of REPEATS (default 3) per setting, then one JSON line. These are
# whole-process times (startup and weight loading included), so they understate the kernels' own
# gain; the ops alone: mmtrain_tests --gtest_also_run_disabled_tests --gtest_filter=FusedOps.DISABLED_Timing
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 CONFIG BATCH [REPEATS]" >&2
  exit 2
fi
config=$1 batch=$2 repeats=${3:-3}
bin=${MMTRAIN_BIN:-$(dirname "$0")/../build/bin/mmtrain}
[[ -x $bin ]] || { echo "$0: no mmtrain binary at $bin (set MMTRAIN_BIN)" >&2; exit 2; }
[[ -f $config ]] || { echo "$0: no config at $config" >&2; exit 2; }
[[ -f $batch ]] || { echo "$0: no batch at $batch" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

best() {  # best wall seconds of $repeats runs of debug step with fused_ops=$1
  local fused=$1 best_s="" start end s
  for ((i = 0; i < repeats; ++i)); do
    start=$(date +%s.%N)
    "$bin" debug step "$config" --batch "$batch" --out "$out/step_$fused.safetensors" \
      --set "model.config.fused_ops=$fused" > "$out/log_$fused.txt" 2>&1 \
      || { cat "$out/log_$fused.txt" >&2; exit 1; }
    end=$(date +%s.%N)
    s=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')
    if [[ -z $best_s ]] || awk -v a="$s" -v b="$best_s" 'BEGIN { exit !(a < b) }'; then best_s=$s; fi
  done
  echo "$best_s"
}

on=$(best true)
off=$(best false)
echo "debug step, best of $repeats: fused_ops=true ${on} s, fused_ops=false ${off} s"
echo "{\"fused_s\": $on, \"reference_s\": $off, \"repeats\": $repeats}"
