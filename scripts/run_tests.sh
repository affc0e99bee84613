#!/usr/bin/env bash
# Runs every test: the CUDA files' compile check, the C++ suite through ctest, then the end-to-end
# and parity tests with pytest.
# ctest runs serially: concurrent Gloo meshes on loopback can steal each other's ephemeral ports.
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
export MMTRAIN_BIN="$PWD/$BUILD_DIR/bin/mmtrain"
export MMTRAIN_BUILD_DIR="$PWD/$BUILD_DIR"  # tests/parity runs $MMTRAIN_BUILD_DIR/bin/mmtrain_tests
# The build without the native CPU kernels (MMTRAIN_NATIVE_KERNELS=OFF, and every non-x86-64 host)
# configures; its code ran above as ctest's portable_kernels.* (mmtrain_portable_tests).
# Each stage prints its time (CI reads them: the whole of .ci/run must stay under 60 minutes).
stage() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "stage $name: $((SECONDS - start)) s"
}
portable_configure() {
  local dir
  dir=$(mktemp -d)
  cmake -S . -B "$dir" -G Ninja -DMMTRAIN_NATIVE_KERNELS=OFF | grep "native CPU kernels: OFF"
  rm -rf "$dir"
}
stage portable-configure portable_configure
# The files whose code differs under MMTRAIN_CUDA, compiled against the CUDA wheel's headers (the
# full CUDA build is scripts/build_cuda.sh).
stage cuda-compile .venv/bin/python scripts/check_cuda_compile.py "$BUILD_DIR"
stage ctest bash -c "cd '$BUILD_DIR' && ctest --output-on-failure --timeout 900"
stage pytest .venv/bin/python -m pytest -q --durations=20 tests/parity tests/e2e
