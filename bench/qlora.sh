#!/usr/bin/env bash
# QLoRA (features.lora.base_quant) against LoRA over a bf16 base on 2 ranks, both models (bench/qlora.py
# says what it measures). Usage: bench/qlora.sh [BUILD_DIR]; the last line of stdout is one JSON object.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../.venv/bin/python" "$here/qlora.py" "$@"
