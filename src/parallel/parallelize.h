// The parallelize chain: how a built model (parameters are shapes only) becomes a trained,
// distributed one over a device mesh (dist/device_mesh.h), in this fixed order:
//   0. context parallelism (parallel.ring_attention_size, ulysses_parallel_size): the model gets
//      the mesh's ContextParallel and splits its sequence over the CP ranks
//      (parallel/context_parallel.h); refused for a model that cannot;
//   1. recompute (features.recompute_plan): a block hook that runs the block without keeping
//      activations and again inside backward (parallel/recompute.h);
//   2. FSDP (parallel.fsdp_plan): a block hook that gathers the unit's parameters around every
//      run of its block, the recompute run in backward included; shards over the mesh's fsdp
//      group (dp_shard x cp) and all-reduces grads across its replicas (fsdp/fully_shard.h).
//   1b. activation offload (features.enable_activation_offload): what the selected blocks keep for
//      backward waits in the host tier: a recomputed block's input (through recompute's
//      saved-input packer), or everything autograd saves in a block that is not recomputed
//      (saved-tensor hooks) (parallel/activation_offload.h);
// A block's hooks run outermost first: FSDP sits inside recompute so that the recomputed forward
// finds its unit gathered. No step knows the internals of another. The offload features share
// one OffloadTiers (host pool, copy stream, counters); FSDP's cpu_offload keeps its shards there.
#pragma once
#include "dist/device_mesh.h"
#include "fsdp/fully_shard.h"
#include "parallel/features_config.h"
#include "parallel/parallel_config.h"

#include <memory>
#include <string>
#include <vector>

namespace mmtrain {

struct ParallelizePlan {
  std::vector<std::string> recompute_modules;  // blocks to recompute; empty = none
  std::vector<std::string> activation_offload_modules;  // recomputed blocks whose inputs go to the host; empty = none
  FsdpConfig fsdp;
};

// The plan the YAML's parallel and features sections ask for.
ParallelizePlan parallelize_plan(const ParallelConfig& parallel, const FeaturesConfig& features);

// Applies the chain to model in the fixed order; the returned engine owns the shards (zeroed:
// load or init them next). tiers: the offload tiers the plan's offload features use (null when
// it has none).
std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, const DeviceMesh& mesh,
                                  std::shared_ptr<OffloadTiers> tiers = nullptr);
// The same with FSDP over one group and no other dimension (tests, single-group tools).
std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, std::shared_ptr<Comm> comm,
                                  at::Device device = at::kCPU, std::shared_ptr<OffloadTiers> tiers = nullptr);

}  // namespace mmtrain
