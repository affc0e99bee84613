#!/usr/bin/env bash
# Magistral-Small-2509 SFT through torchrun (MindSpeed-MM examples/magistral-2509 recipe).
#   NPROC_PER_NODE   ranks on this node (default 8; the seed's NPUS_PER_NODE is an alias)
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT   multi-node rendezvous (defaults: one node)
#   CONFIG           YAML (default: the full-size config beside this script)
#   MODEL_DIR, DATA_JSON, IMAGE_DIR   override the config's model/tokenizer, records and image root
# Extra arguments go to `mmtrain train` (e.g. --set training.train_iters=100).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/examples/seed_env_aliases.sh"
NPROC_PER_NODE=${NPROC_PER_NODE:-8}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
CONFIG=${CONFIG:-$ROOT/examples/magistral/magistral_small_2509.yaml}
overrides=()
if [ -n "${MODEL_DIR:-}" ]; then
  overrides+=(--set "model.model_name_or_path=$MODEL_DIR"
              --set "data.dataset_param.preprocess_parameters.model_name_or_path=$MODEL_DIR")
fi
[ -n "${DATA_JSON:-}" ] && overrides+=(--set "data.dataset_param.basic_parameters.dataset=$DATA_JSON")
[ -n "${IMAGE_DIR:-}" ] && overrides+=(--set "data.dataset_param.basic_parameters.dataset_dir=$IMAGE_DIR")
exec "${TORCHRUN:-$ROOT/.venv/bin/torchrun}" --nproc-per-node "$NPROC_PER_NODE" --nnodes "$NNODES" \
  --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --no-python \
  "${MMTRAIN_BIN:-$ROOT/build/bin/mmtrain}" train "$CONFIG" "${overrides[@]}" "$@"
