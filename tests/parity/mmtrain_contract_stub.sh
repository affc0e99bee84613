#!/usr/bin/env bash
# Stand-in for build/bin/mmtrain that honours mmtrain's CLI/output contract using the PyTorch
# FSDP2 reference trainer. For checking the parity harness itself, never as evidence about mmtrain:
#   MMTRAIN_BIN=tests/parity/mmtrain_contract_stub.sh .venv/bin/python -m pytest tests/parity
# Usage (as torchrun runs it): mmtrain_contract_stub.sh train CFG.yaml [--set key=value ...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../../.venv/bin/python" "$here/reference_transformer.py" mmtrain-stub "$@"
