#!/usr/bin/env bash
# Context-parallel attention against one rank doing the whole sequence: forward + backward of one
# sample of SEQLEN tokens (default 4096; 8 query / 2 KV heads of 64, fp32), full attention (the
# DiT's) and causal (the LM's, zigzag ring chunks), for ring 2 and Ulysses 2 on 2 ranks x 1
# thread against 1 rank x 1 thread. Runs are interleaved (A B C, C B A, ...) on this noisy
# machine; each figure is the median over rounds of each run's median of REPEATS.
#   fraction_of_ideal = t(1 rank) / (2 x t(2 ranks))   (1.0 = perfect scaling over 2 ranks)
# Usage: bench/cp_attention.sh [SEQLEN] [ROUNDS] [REPEATS]   binary: $MMTRAIN_BIN, else build/bin/mmtrain
# Prints one line per run, then one JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
seqlen=${1:-4096} rounds=${2:-3} repeats=${3:-3}
bin=${MMTRAIN_BIN:-$PWD/build/bin/mmtrain}
torchrun=$PWD/.venv/bin/torchrun
[[ -x $bin ]] || { echo "$0: no mmtrain binary at $bin (set MMTRAIN_BIN)" >&2; exit 2; }
export OMP_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # layout causal_flag -> appends one JSON line to $out/<layout><causal>.jsonl
  local layout=$1 causal=$2 args=(measure cp-attention --seqlen "$seqlen" --repeats "$repeats" $causal)
  case $layout in
    one) "$bin" "${args[@]}" ;;
    ring2) "$torchrun" --nproc-per-node 2 --master-port 29561 --no-python "$bin" "${args[@]}" --ring 2 ;;
    ulysses2) "$torchrun" --nproc-per-node 2 --master-port 29562 --no-python "$bin" "${args[@]}" --ulysses 2 ;;
  esac 2>/dev/null | tail -1 | tee -a "$out/$layout$causal.jsonl"
}

for causal in "" "--causal"; do
  for ((r = 0; r < rounds; ++r)); do
    if ((r % 2 == 0)); then order=(one ring2 ulysses2); else order=(ulysses2 ring2 one); fi
    for layout in "${order[@]}"; do run "$layout" "$causal"; done
  done
done

"$PWD/.venv/bin/python" - "$out" "$seqlen" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
out, seqlen = Path(sys.argv[1]), int(sys.argv[2])
result = {"bench": "cp_attention", "seqlen": seqlen, "ranks": 2, "threads_per_rank": 1}
for causal in ("", "--causal"):
    mask = "causal" if causal else "full"
    ms = {layout: statistics.median(json.loads(l)["forward_backward_ms"] for l in open(out / f"{layout}{causal}.jsonl"))
          for layout in ("one", "ring2", "ulysses2")}
    result[f"{mask}_one_rank_ms"] = round(ms["one"], 1)
    for layout in ("ring2", "ulysses2"):
        result[f"{mask}_{layout}_ms"] = round(ms[layout], 1)
        result[f"{mask}_{layout}_fraction_of_ideal"] = round(ms["one"] / (2 * ms[layout]), 3)
print(json.dumps(result))
PYEOF
