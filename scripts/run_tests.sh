#!/usr/bin/env bash
# Runs every test: the C++ suite through ctest, then the end-to-end and parity tests with pytest.
# ctest runs serially: concurrent Gloo meshes on loopback can steal each other's ephemeral ports.
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
export MMTRAIN_BIN="$PWD/$BUILD_DIR/bin/mmtrain"
export MMTRAIN_BUILD_DIR="$PWD/$BUILD_DIR"  # tests/parity runs $MMTRAIN_BUILD_DIR/bin/mmtrain_tests
# The build without the native CPU kernels (MMTRAIN_NATIVE_KERNELS=OFF, and every non-x86-64 host)
# configures; its code ran above as ctest's portable_kernels.* (mmtrain_portable_tests).
portable_configure=$(mktemp -d)
cmake -S . -B "$portable_configure" -G Ninja -DMMTRAIN_NATIVE_KERNELS=OFF | grep "native CPU kernels: OFF"
rm -rf "$portable_configure"
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 900)
.venv/bin/python -m pytest -q tests/parity tests/e2e
