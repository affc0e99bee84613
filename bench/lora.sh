#!/usr/bin/env bash
# LoRA against full fine-tuning on 2 ranks, both models (bench/lora.py says what it measures).
# Usage: bench/lora.sh [BUILD_DIR]; the last line of stdout is one JSON object.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../.venv/bin/python" "$here/lora.py" "$@"
