# Sourced by the sbatch scripts beside it, inside an allocation: srun starts one torchrun agent per
# node; the agents rendezvous (c10d) on the allocation's first node and start GPUS_PER_NODE ranks
# each. Arguments: the YAML, then whatever `mmtrain train` should get after it.
#   MMTRAIN_ROOT   the checkout with build/bin/mmtrain and .venv (default: the directory sbatch was
#                  run from; sbatch runs a copy of the script, so its own path says nothing)
#   NNODES         nodes (default: the allocation's, SLURM_NNODES)
#   GPUS_PER_NODE  ranks per node (default: SLURM_GPUS_ON_NODE, else 8)
#   RDZV_PORT      the rendezvous port on the first node (default 29500)
srun_torchrun() {
  local root=${MMTRAIN_ROOT:-$SLURM_SUBMIT_DIR}
  local nnodes=${NNODES:-$SLURM_NNODES}
  local per_node=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
  local rdzv_host
  rdzv_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  echo "mmtrain: $nnodes node(s) x $per_node rank(s), rendezvous on $rdzv_host:${RDZV_PORT:-29500}" >&2
  srun --nodes "$nnodes" --ntasks "$nnodes" --ntasks-per-node 1 --kill-on-bad-exit=1 \
    "${TORCHRUN:-$root/.venv/bin/torchrun}" --nnodes "$nnodes" --nproc-per-node "$per_node" \
    --rdzv-backend c10d --rdzv-endpoint "$rdzv_host:${RDZV_PORT:-29500}" --rdzv-id "$SLURM_JOB_ID" \
    --no-python "${MMTRAIN_BIN:-$root/build/bin/mmtrain}" train "$@"
}
