// ParallelDims: the one place that turns the `parallel` section's degrees and the world size into
// the degrees a run has (torchtitan's ParallelDims). It resolves `auto`, checks the arithmetic
// between the degrees and the world (MindSpeed's ParallelArguments rules), and gives the device
// mesh its shape; the mesh, the config checks, the sampler's data-parallel size, `plan` and the
// global-batch arithmetic all read it rather than dividing the world themselves.
//
//   world = tensor x dp_replicate x dp_shard x ring x ulysses
//   fsdp  = dp_shard x ring x ulysses   (fully_shard_parallel_size; auto = world / tensor)
//   dp    = dp_replicate x dp_shard     (ranks that read different samples; data_parallel_size)
//   cp    = ring x ulysses              (ranks that share one sample)
#pragma once
#include "dist/device_mesh.h"
#include "parallel/parallel_config.h"

#include <string>

namespace mmtrain {

struct ParallelDims {
  int world = 1;
  int tensor = 1;        // tensor_parallel_size: checked here; `train` runs only 1, `plan` accepts more
  int dp_replicate = 1;  // HSDP replicas: world / (tensor x fsdp)
  int dp_shard = 1;      // fsdp / cp
  int ring = 1;
  int ulysses = 1;

  int cp() const { return ring * ulysses; }
  int fsdp() const { return dp_shard * cp(); }
  int dp() const { return dp_replicate * dp_shard; }
  // The device mesh of the ranks outside tensor parallelism (tensor == 1 in every run).
  MeshShape mesh() const;
};

// Resolves and checks config against world_size: the world divisible by tensor x ulysses x ring;
// fully_shard_parallel_size a divisor of world / tensor and a multiple of ulysses x ring;
// data_parallel_size, when set, equal to the dp the world implies; the world divisible by
// expert_parallel_size x expert_fully_shard_parallel_size. Errors start with `where` ("config
// foo.yaml: ") and name the key and the numbers.
ParallelDims parallel_dims(const ParallelConfig& config, int world_size, const std::string& where);

}  // namespace mmtrain
