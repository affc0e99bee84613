#!/usr/bin/env bash
# Full-parameter MagiHuman training through torchrun (the seed's launch script).
#   NPROC_PER_NODE   ranks on this node (default 8; the seed's NPUS_PER_NODE is an alias)
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT   multi-node rendezvous (defaults: one node)
#   CONFIG           YAML (default: the full-size config beside this script)
#   MAGIHUMAN_FUSED_OPS=0        reference ops instead of the fused kernels (A/B runs; the seed's
#                                MAGIHUMAN_NPU_FUSED_OPS is an alias)
#   MAGIHUMAN_DEINTERLEAVE_MLP=0 keep the checkpoint's interleaved gated-MLP rows (A/B runs)
# Extra arguments go to `mmtrain train` (e.g. --set training.train_iters=100).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/examples/seed_env_aliases.sh"
NPROC_PER_NODE=${NPROC_PER_NODE:-8}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
CONFIG=${CONFIG:-$ROOT/examples/magihuman/magihuman_config_t2av.yaml}
fused=$([ "${MAGIHUMAN_FUSED_OPS:-1}" = "0" ] && echo false || echo true)
deinterleave=$([ "${MAGIHUMAN_DEINTERLEAVE_MLP:-1}" = "0" ] && echo false || echo true)
exec "${TORCHRUN:-$ROOT/.venv/bin/torchrun}" --nproc-per-node "$NPROC_PER_NODE" --nnodes "$NNODES" \
  --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --no-python \
  "${MMTRAIN_BIN:-$ROOT/build/bin/mmtrain}" train "$CONFIG" \
  --set model.config.fused_ops=$fused --set model.config.deinterleave_mlp=$deinterleave "$@"
