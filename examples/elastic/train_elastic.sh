#!/usr/bin/env bash
# Elastic training: run this on every node (1 to MAX_NODES of them). torchrun's c10d rendezvous
# forms the world from the nodes that are up; when a node dies, the agents on the others restart
# their workers on the smaller world, `training.load: auto` reshards the newest checkpoint onto it
# and the accumulation derived from the pinned global batch rises to keep it (docs/elastic.md).
#   RDZV_HOST  a host every node reaches; its agent serves the rendezvous store, so losing that
#              node ends the job (run it on the most reliable node)
#   CONFIG     the YAML; it needs training.save and a pinned training.global_batch_size with
#              gradient_accumulation_steps 0 (this script passes both, and load: auto)
# Usage: RDZV_HOST=node0 CONFIG=run.yaml GLOBAL_BATCH=256 examples/elastic/train_elastic.sh
set -euo pipefail
: "${RDZV_HOST:?set RDZV_HOST to the node that serves the rendezvous}"
: "${CONFIG:?set CONFIG to the training YAML}"
: "${GLOBAL_BATCH:?set GLOBAL_BATCH, the global batch to keep on every world size}"
MIN_NODES=${MIN_NODES:-1}
MAX_NODES=${MAX_NODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
RDZV_PORT=${RDZV_PORT:-29500}
MMTRAIN=${MMTRAIN:-build/bin/mmtrain}
exec torchrun --nnodes "$MIN_NODES:$MAX_NODES" --nproc-per-node "$GPUS_PER_NODE" \
  --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:$RDZV_PORT" --rdzv-id "${RDZV_ID:-mmtrain}" \
  --max-restarts "${MAX_RESTARTS:-3}" --rdzv-conf "join_timeout=600,last_call_timeout=${LAST_CALL_S:-30}" \
  --no-python "$MMTRAIN" train "$CONFIG" \
  --set training.load=auto --set training.gradient_accumulation_steps=0 \
  --set "training.global_batch_size=$GLOBAL_BATCH" --set training.async_save=true
