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
// A block's hooks run outermost first: FSDP sits inside recompute so that the recomputed forward
// finds its unit gathered. No step knows the internals of another. Activation offload is to be a
// further block-hook step.
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
  FsdpConfig fsdp;
};

// The plan the YAML's parallel and features sections ask for.
ParallelizePlan parallelize_plan(const ParallelConfig& parallel, const FeaturesConfig& features);

// Applies the chain to model in the fixed order; the returned engine owns the shards (zeroed:
// load or init them next).
std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, const DeviceMesh& mesh);
// The same with FSDP over one group and no other dimension (tests, single-group tools).
std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, std::shared_ptr<Comm> comm,
                                  at::Device device = at::kCPU);

}  // namespace mmtrain
