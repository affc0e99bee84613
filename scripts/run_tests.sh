#!/usr/bin/env bash
# Runs every test: the C++ suite through ctest, then the end-to-end and parity tests with pytest.
# ctest runs serially: concurrent Gloo meshes on loopback can steal each other's ephemeral ports.
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
export MMTRAIN_BIN="$PWD/$BUILD_DIR/bin/mmtrain"
export MMTRAIN_BUILD_DIR="$PWD/$BUILD_DIR"  # tests/parity runs $MMTRAIN_BUILD_DIR/bin/mmtrain_tests
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 900)
.venv/bin/python -m pytest -q tests/parity tests/e2e
