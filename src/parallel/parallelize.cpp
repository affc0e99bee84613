#include "parallel/parallelize.h"

#include "parallel/recompute.h"

namespace mmtrain {

ParallelizePlan parallelize_plan(const ParallelConfig& parallel, const FeaturesConfig& features) {
  ParallelizePlan plan;
  if (features.recompute) plan.recompute_modules = features.recompute_plan.apply_modules;
  plan.fsdp = parallel.fsdp_plan;
  return plan;
}

std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, std::shared_ptr<Comm> comm,
                                  at::Device device) {
  apply_recompute(model, plan.recompute_modules);
  return std::make_unique<Fsdp>(model, std::move(comm), plan.fsdp, device);
}

}  // namespace mmtrain
