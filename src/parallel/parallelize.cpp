#include "parallel/parallelize.h"

#include "core/error.h"
#include "parallel/context_parallel.h"
#include "parallel/recompute.h"

namespace mmtrain {

ParallelizePlan parallelize_plan(const ParallelConfig& parallel, const FeaturesConfig& features) {
  ParallelizePlan plan;
  if (features.recompute) plan.recompute_modules = features.recompute_plan.apply_modules;
  plan.fsdp = parallel.fsdp_plan;
  return plan;
}

std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, const DeviceMesh& mesh) {
  if (mesh.shape().cp() > 1) {
    auto* target = dynamic_cast<SplitsSequence*>(&model);
    if (!target)
      fail("parallel.ring_attention_size / ulysses_parallel_size: this model does not support context parallelism");
    check_ulysses_heads(target->attention_heads(), mesh.shape().ulysses);
    target->use_sequence_splitter(std::make_shared<ContextParallel>(mesh.ring(), mesh.ulysses(), mesh.cp()));
  }
  apply_recompute(model, plan.recompute_modules);
  return std::make_unique<Fsdp>(model, mesh.fsdp(), plan.fsdp, mesh.world()->device(),
                                FsdpReduction{mesh.replicate(), mesh.dp_size()});
}

std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, std::shared_ptr<Comm> comm,
                                  at::Device device) {
  apply_recompute(model, plan.recompute_modules);
  return std::make_unique<Fsdp>(model, std::move(comm), plan.fsdp, device);
}

}  // namespace mmtrain
