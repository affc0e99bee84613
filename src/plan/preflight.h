// Checks a run makes before it allocates anything model-sized, so that a mistake costs seconds,
// not the minutes (or the OOM kill) of building a 15B model first:
//   - every path the run will read exists (the initial weights, training.load) and the save root
//     and training.offload_dir are writable by this rank (a probe file, removed again);
//   - the planner's per-rank bytes (fp32 shards, grads, AdamW moments and the gathered units in
//     flight: a lower bound, activations not counted) fit the memory there is: on CPU, times the
//     ranks on this node, the cgroup's limit or MemAvailable, whichever is smaller; on CUDA, the
//     free memory of this rank's device (cudaMemGetInfo). With training.offload_dir the moments
//     count only as their RAM windows, and the offload filesystem must hold them all.
#pragma once
#include "config/config.h"
#include "dist/runtime.h"
#include "nn/module.h"

#include <cstdint>
#include <optional>

namespace mmtrain {

void preflight_paths(const Config& config, int rank);

// Bytes this process may still allocate: min(MemAvailable, cgroup memory.max - memory.current);
// nullopt when neither can be read.
std::optional<int64_t> available_memory_bytes();

// Bytes free on this process's current CUDA device; nullopt in a build without CUDA.
std::optional<int64_t> cuda_free_memory_bytes();

// The chunk of swapped state (optim/swapped_state.h: adamw_swap's moments, K = 2; an offloaded EMA,
// K = 1): training.mem_fraction_static of the device's free memory (on CPU, the host's available
// memory), no larger than the largest FSDP unit's shard.
int64_t offload_chunk_numel(const TrainingConfig& training, Device device, int64_t largest_shard_numel,
                            int tensors_per_param);

// model: built (shapes only), not yet parallelized.
void preflight_memory(const Config& config, Module& model, const LaunchEnv& env, Device device, int fsdp_size);

}  // namespace mmtrain
