#include "parallel/parallel_dims.h"

#include "core/error.h"

#include <utility>

namespace mmtrain {

MeshShape ParallelDims::mesh() const {
  MeshShape shape;
  shape.dp_replicate = dp_replicate;
  shape.dp_shard = dp_shard;
  shape.ring = ring;
  shape.ulysses = ulysses;
  return shape;
}

ParallelDims parallel_dims(const ParallelConfig& p, int world_size, const std::string& where) {
  if (world_size < 1) fail(where, "world size: expected >= 1, found ", world_size);
  // A ParallelConfig built in code skips the schema's checks; sizes below 1 would divide by zero.
  for (const auto& [name, size] : {std::pair<const char*, int>{"tensor_parallel_size", p.tensor_parallel_size},
                                   {"ulysses_parallel_size", p.ulysses_parallel_size},
                                   {"ring_attention_size", p.ring_attention_size},
                                   {"expert_parallel_size", p.expert_parallel_size}})
    if (size < 1) fail(where, "parallel.", name, ": expected >= 1, found ", size);
  if (p.fully_shard_parallel_size < 0 || p.expert_fully_shard_parallel_size < 0)
    fail(where, "parallel: expected auto or positive fully-shard sizes, found ", p.fully_shard_parallel_size, " and ",
         p.expert_fully_shard_parallel_size);

  ParallelDims dims;
  dims.world = world_size;
  dims.tensor = p.tensor_parallel_size;
  dims.ring = p.ring_attention_size;
  dims.ulysses = p.ulysses_parallel_size;
  const int tp = dims.tensor, cp = dims.cp();
  if (world_size % (tp * cp) != 0)
    fail(where, "parallel: expected the world size ", world_size,
         " to be divisible by tensor_parallel_size * ulysses_parallel_size * ring_attention_size = ", tp, " * ",
         p.ulysses_parallel_size, " * ", p.ring_attention_size, " = ", tp * cp, ", found remainder ",
         world_size % (tp * cp));
  // auto (0) is every rank outside tensor parallelism, as MindSpeed's ParallelArguments.
  const int fsdp = p.fully_shard_parallel_size == 0 ? world_size / tp : p.fully_shard_parallel_size;
  if ((world_size / tp) % fsdp != 0)
    fail(where, "parallel.fully_shard_parallel_size: expected auto or a divisor of world size / tensor_parallel_size = ",
         world_size / tp, ", found ", fsdp);
  if (fsdp % cp != 0)
    fail(where, "parallel.fully_shard_parallel_size: expected a multiple of ulysses_parallel_size * ring_attention_size = ",
         cp, " (FSDP shards across the context-parallel ranks too), found ", fsdp);
  dims.dp_shard = fsdp / cp;
  dims.dp_replicate = world_size / tp / fsdp;
  if (p.data_parallel_size != 0 && p.data_parallel_size != dims.dp())
    fail(where, "parallel.data_parallel_size: expected auto or world size / (tensor_parallel_size * ",
         "ulysses_parallel_size * ring_attention_size) = ", dims.dp(), ", found ", p.data_parallel_size);

  const int ep = p.expert_parallel_size;
  if (world_size % ep != 0)
    fail(where, "parallel.expert_parallel_size: expected a divisor of the world size ", world_size, ", found ", ep);
  const int efsdp = p.expert_fully_shard_parallel_size == 0 ? world_size / ep : p.expert_fully_shard_parallel_size;
  if (world_size % (ep * efsdp) != 0)
    fail(where, "parallel.expert_fully_shard_parallel_size: expected auto or a divisor of world size / ",
         "expert_parallel_size = ", world_size / ep, ", found ", efsdp);
  return dims;
}

}  // namespace mmtrain
