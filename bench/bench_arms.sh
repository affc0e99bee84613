# Sourced by the A/B benches (fsdp_vs_torch.sh, magihuman_vs_torch.sh).
#   run_rounds ARM...   runs every arm once per round for ROUNDS rounds, in the order A B C, then
#                       C B A, ..., so drift on a shared machine falls on every arm alike. Each run
#                       is `arm_command ARM OUT` (the caller defines it), writing OUT/metrics.jsonl,
#                       with OUT = $BENCH_DIR/runs/ARM_rK and its log beside it; on a failure it
#                       prints the log's tail and exits 1.
# Needs BENCH_DIR and ROUNDS.
run_rounds() {
  local arms=("$@") order round i arm out
  mkdir -p "$BENCH_DIR/runs"
  for ((round = 1; round <= ROUNDS; ++round)); do
    order=()
    if ((round % 2)); then order=("${arms[@]}"); else for ((i = ${#arms[@]} - 1; i >= 0; --i)); do order+=("${arms[i]}"); done; fi
    for arm in "${order[@]}"; do
      out="$BENCH_DIR/runs/${arm}_r$round"
      rm -rf "$out"
      echo "bench: round $round: $arm (log $out.log)" >&2
      if ! arm_command "$arm" "$out" >"$out.log" 2>&1; then
        echo "bench: $arm failed; last lines of its log:" >&2
        tail -n 40 "$out.log" >&2
        exit 1
      fi
    done
  done
}
