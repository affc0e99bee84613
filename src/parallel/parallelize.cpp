#include "parallel/parallelize.h"

#include "core/error.h"
#include "parallel/activation_offload.h"
#include "parallel/context_parallel.h"
#include "parallel/recompute.h"

namespace mmtrain {

ParallelizePlan parallelize_plan(const ParallelConfig& parallel, const FeaturesConfig& features) {
  ParallelizePlan plan;
  if (features.recompute) plan.recompute_modules = features.recompute_plan.apply_modules;
  if (features.enable_activation_offload) {
    if (!features.recompute)
      fail("features.enable_activation_offload: needs features.recompute on the same blocks (a recomputed block "
           "keeps only its input, which is what goes to the host; offloading every saved tensor of a block would "
           "need autograd saved-tensor hooks, which LibTorch offers C++ no way to install)");
    plan.activation_offload_modules = features.activation_offload_modules;
  }
  plan.fsdp = parallel.fsdp_plan;
  return plan;
}

namespace {

// Steps 1 and 1b: recompute, with the offloaded blocks' inputs held through the host tier.
void apply_recompute_and_offload(Module& model, const ParallelizePlan& plan, const std::shared_ptr<OffloadTiers>& tiers) {
  std::shared_ptr<SavedInputPacker> offload;
  if (!plan.activation_offload_modules.empty()) {
    if (!tiers) fail("features.enable_activation_offload: parallelize was given no offload tiers");
    offload = std::make_shared<ActivationOffload>(tiers);
  }
  apply_recompute(model, plan.recompute_modules, plan.activation_offload_modules, offload,
                  "features.activation_offload_plan.apply_modules");
}

}  // namespace

std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, const DeviceMesh& mesh,
                                  std::shared_ptr<OffloadTiers> tiers) {
  if (mesh.shape().cp() > 1) {
    auto* target = dynamic_cast<SplitsSequence*>(&model);
    if (!target)
      fail("parallel.ring_attention_size / ulysses_parallel_size: this model does not support context parallelism");
    check_ulysses_heads(target->attention_heads(), mesh.shape().ulysses);
    target->use_sequence_splitter(std::make_shared<ContextParallel>(mesh.ring(), mesh.ulysses(), mesh.cp()));
  }
  apply_recompute_and_offload(model, plan, tiers);
  return std::make_unique<Fsdp>(model, mesh.fsdp(), plan.fsdp, mesh.world()->device(),
                                FsdpReduction{mesh.replicate(), mesh.dp_size()}, std::move(tiers));
}

std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, std::shared_ptr<Comm> comm,
                                  at::Device device, std::shared_ptr<OffloadTiers> tiers) {
  apply_recompute_and_offload(model, plan, tiers);
  return std::make_unique<Fsdp>(model, std::move(comm), plan.fsdp, device, FsdpReduction{}, std::move(tiers));
}

}  // namespace mmtrain
