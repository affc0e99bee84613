# Sourced by bench/cp_compare.sh and bench/cp_memory.sh (from the repository root): the binaries,
# one thread per rank, the work directory ($1 or a fresh one), and the tiny-width MagiHuman both
# measure (hidden 128, 4 layers, 4 q / 2 KV heads, modality experts in layers 0 and 3).
work=${1:-}; [[ -n $work ]] || work=$(mktemp -d)
bin=${MMTRAIN_BIN:-$PWD/build/bin/mmtrain}
torchrun=$PWD/.venv/bin/torchrun
[[ -x $bin ]] || { echo "$0: no mmtrain binary at $bin (set MMTRAIN_BIN)" >&2; exit 2; }
export OMP_NUM_THREADS=1
mkdir -p "$work"
model='{num_layers: 4, hidden_size: 128, head_dim: 32, num_query_groups: 2, video_in_channels: 16,
        audio_in_channels: 8, text_in_channels: 24, mm_layers: [0, 3], gelu7_layers: [0]}'
