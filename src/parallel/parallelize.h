// The parallelize chain: how a built model (parameters are shapes only) becomes a trained,
// distributed one. Each step installs its own hook on the blocks it selects; a block's hooks run
// outermost first, so the order below is the order they wrap the block's forward:
//   1. recompute (features.recompute_plan): runs the block without keeping activations and again
//      inside backward (parallel/recompute.h);
//   2. FSDP (parallel.fsdp_plan): gathers the unit's parameters around every run of its block,
//      the recompute run in backward included, and reduce-scatters its grads (fsdp/fully_shard.h).
// The order matters: FSDP sits inside recompute so that the recomputed forward finds its unit
// gathered; no step knows the internals of another. Context parallelism and activation offload
// are to be further steps of this chain.
#pragma once
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
std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, std::shared_ptr<Comm> comm,
                                  at::Device device = at::kCPU);

}  // namespace mmtrain
