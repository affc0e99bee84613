#!/usr/bin/env bash
# One command that proves a GPU run, for the first machine with a GPU: builds mmtrain against that
# machine's own CUDA torch (its version checked against scripts/cuda_wheels.txt's pin, which CI
# compiles the CUDA files against), with the C++ dependencies carried from a Debian machine as
# extracted packages (scripts/device_deps.sh -> third_party_device/), then runs scripts/gpu_check.py's
# checks in order of priority, one JSON per check in $OUT (docs/gpu.md lists them). Sized for
# 10 minutes of device time: the build (~2 min on 16 cores), then the checks until BUDGET_S.
#   scripts/gpu_check.sh          on the GPU machine (OUT, TORCH_PYTHON=python3, DEPS, BUILD_DIR)
#   scripts/gpu_check.sh --cpu    here: no CUDA build; every check on the CPU with the tiny model,
#                                 through the CPU build in BUILD_DIR (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
start=$SECONDS
if [ "${1:-}" = "--cpu" ]; then
  BUILD_DIR=${BUILD_DIR:-build}
  exec .venv/bin/python scripts/gpu_check.py --build "$BUILD_DIR" --out "$OUT" --device cpu --width tiny \
    --budget-s "${BUDGET_S:-600}"
fi
BUILD_DIR=${BUILD_DIR:-build-gpu}
TORCH_PYTHON=${TORCH_PYTHON:-python3}
DEPS=${DEPS:-third_party_device/root}
[ -d "$DEPS" ] || { echo "gpu_check: no $DEPS: run scripts/device_deps.sh on a Debian machine and carry it" >&2; exit 1; }
# What this machine is: its torch (against the pin), CUDA and GPU.
"$TORCH_PYTHON" - "$OUT/machine.json" "$(grep -m1 '^torch==' scripts/cuda_wheels.txt)" <<'PYEOF'
import json, sys, torch
pin = sys.argv[2].split("==")[1]
info = {"torch": torch.__version__, "pinned_torch": pin, "torch_matches_pin": torch.__version__.split("+")[0] == pin,
        "cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
json.dump(info, open(sys.argv[1], "w"), indent=1)
print("gpu_check:", info)
if not info["gpus"]:
    sys.exit("gpu_check: torch sees no GPU")
PYEOF
if ! TORCH_PYTHON=$TORCH_PYTHON DEPS=$DEPS bash scripts/build_cuda.sh "$BUILD_DIR" mmtrain mmtrain_tests >"$OUT/build.log" 2>&1; then
  tail -n 40 "$OUT/build.log" >&2
  echo "gpu_check: the build failed ($OUT/build.log)" >&2
  exit 1
fi
build_s=$((SECONDS - start))
echo "gpu_check: built in $build_s s"
"$TORCH_PYTHON" scripts/gpu_check.py --build "$BUILD_DIR" --out "$OUT" --device cuda --width real \
  --budget-s "${BUDGET_S:-$((540 - build_s))}"
