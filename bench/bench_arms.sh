# Sourced by the A/B benches (fsdp_vs_torch.sh, magihuman_vs_torch.sh, ...), from the repository root.
#   bench_setup DIR_NAME [BUILD_DIR]
#                       the settings both benches share: BUILD_DIR (default build, made
#                       absolute), PY, BIN ($MMTRAIN_BIN or BUILD_DIR/bin/mmtrain), BENCH_DIR
#                       (default BUILD_DIR/DIR_NAME, created), WORLD (2), ROUNDS (2), TCMALLOC
#                       (which must exist), and one intra-op thread per rank on both sides: the
#                       comparison is per-core work, not thread scaling.
#   require_mmtrain     exits, saying to build first, when BIN is not an executable
#   measure_gemm_peak   the peak the ideal step is measured against, taken in the same run: this
#                       CPU's GEMM rate on one thread in the bench's PARAM_DTYPE (read from
#                       BENCH_DIR/bench_meta.json), into BENCH_DIR/gemm.json.
#   mmtrain_arm OUT [ARGS...]
#                       mmtrain trains BENCH_DIR/bench.yaml on WORLD ranks, logging into OUT,
#                       ARGS (e.g. --set key=value) appended to its command line.
#   run_logged LABEL OUT CMD...
#                       runs CMD with its output in OUT.log (OUT removed first); on a failure
#                       prints the log's tail and exits 1.
#   run_rounds ARM...   runs every arm once per round for ROUNDS rounds, in the order A B C, then
#                       C B A, ..., so drift on a shared machine falls on every arm alike. Each run
#                       is `arm_command ARM OUT` (the caller defines it), writing OUT/metrics.jsonl,
#                       with OUT = $BENCH_DIR/runs/ARM_rK and its log beside it; on a failure it
#                       prints the log's tail and exits 1.
bench_setup() {
  BUILD_DIR=${2:-build}
  case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$PWD/$BUILD_DIR" ;; esac
  PY="$PWD/.venv/bin/python"
  BIN=${MMTRAIN_BIN:-$BUILD_DIR/bin/mmtrain}
  BENCH_DIR=${BENCH_DIR:-$BUILD_DIR/$1}
  WORLD=${WORLD:-2}
  ROUNDS=${ROUNDS:-2}
  TCMALLOC=${TCMALLOC:-/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4}
  export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
  [ -f "$TCMALLOC" ] || { echo "bench: $TCMALLOC is missing (Debian libtcmalloc-minimal4; scripts/setup.sh installs it)" >&2; exit 1; }
  mkdir -p "$BENCH_DIR"
}

require_mmtrain() {
  [ -x "$BIN" ] || { echo "bench: no mmtrain binary at $BIN (build first: make build)" >&2; exit 1; }
}

measure_gemm_peak() {
  local dtype
  dtype=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['PARAM_DTYPE'])" "$BENCH_DIR/bench_meta.json")
  echo "bench: GEMM peak ($dtype, 1 thread)" >&2
  "$BIN" measure gemm --dtype "$dtype" --threads 1 --repeats 5 | tail -n 1 >"$BENCH_DIR/gemm.json"
}

mmtrain_arm() {
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$WORLD" --no-python \
    "$BIN" train "$BENCH_DIR/bench.yaml" --set "logging.output_dir=$1" "${@:2}"
}

run_logged() {
  local label=$1 out=$2
  rm -rf "$out"
  echo "bench: $label (log $out.log)" >&2
  if ! "${@:3}" >"$out.log" 2>&1; then
    echo "bench: $label failed; last lines of its log:" >&2
    tail -n 40 "$out.log" >&2
    exit 1
  fi
}

run_rounds() {
  local arms=("$@") order round i arm out
  mkdir -p "$BENCH_DIR/runs"
  for ((round = 1; round <= ROUNDS; ++round)); do
    order=()
    if ((round % 2)); then order=("${arms[@]}"); else for ((i = ${#arms[@]} - 1; i >= 0; --i)); do order+=("${arms[i]}"); done; fi
    for arm in "${order[@]}"; do
      out="$BENCH_DIR/runs/${arm}_r$round"
      run_logged "round $round: $arm" "$out" arm_command "$arm" "$out"
    done
  done
}
