# Sourced by the launch scripts: the seed's environment variable names (MindSpeed-MM, written for
# NPUs) are accepted as aliases of ours, and the script says which one it used.
#   NPUS_PER_NODE            -> NPROC_PER_NODE
#   MAGIHUMAN_NPU_FUSED_OPS  -> MAGIHUMAN_FUSED_OPS

# alias_env OURS SEEDS: when SEEDS is set, OURS takes its value unless OURS is set too (then OURS
# wins, and a differing SEEDS is reported).
alias_env() {
  local ours=$1 seeds=$2
  [ -n "${!seeds+x}" ] || return 0
  if [ -z "${!ours+x}" ]; then
    export "$ours=${!seeds}"
    echo "launch: $ours=${!ours} from the seed's $seeds" >&2
  elif [ "${!ours}" != "${!seeds}" ]; then
    echo "launch: both $ours=${!ours} and $seeds=${!seeds} are set; using $ours" >&2
  fi
}

alias_env NPROC_PER_NODE NPUS_PER_NODE
alias_env MAGIHUMAN_FUSED_OPS MAGIHUMAN_NPU_FUSED_OPS
