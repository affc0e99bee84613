#include "parallel/parallelize.h"

#include "core/error.h"
#include "parallel/activation_offload.h"
#include "parallel/context_parallel.h"
#include "parallel/recompute.h"

#include <set>
#include <unordered_set>

namespace mmtrain {

ParallelizePlan parallelize_plan(const ParallelConfig& parallel, const FeaturesConfig& features) {
  ParallelizePlan plan;
  if (features.recompute) plan.recompute_modules = features.recompute_plan.apply_modules;
  if (features.enable_activation_offload) plan.activation_offload_modules = features.activation_offload_modules;
  plan.fsdp = parallel.fsdp_plan;
  return plan;
}

namespace {

// Steps 1 and 1b: recompute, and activation offload on its blocks: a recomputed block's input goes
// through recompute's packer, a block that is not recomputed offloads what autograd saves in it.
std::shared_ptr<ActivationOffload> apply_recompute_and_offload(Module& model, const ParallelizePlan& plan,
                                                               const std::shared_ptr<OffloadTiers>& tiers) {
  if (plan.activation_offload_modules.empty()) {
    apply_recompute(model, plan.recompute_modules);
    return nullptr;
  }
  if (!tiers) fail("features.enable_activation_offload: parallelize was given no offload tiers");
  auto offload = std::make_shared<ActivationOffload>(tiers);
  std::set<const Module*> recomputed, packed;
  if (!plan.recompute_modules.empty())
    for (auto& [name, block] : select_blocks(model, plan.recompute_modules, "recompute_plan.apply_modules"))
      recomputed.insert(block);
  for (auto& [name, block] :
       select_blocks(model, plan.activation_offload_modules, "features.activation_offload_plan.apply_modules")) {
    if (recomputed.count(block))
      packed.insert(block);
    else
      block->add_hook(offload->saved_tensor_hook());
  }
  apply_recompute(model, plan.recompute_modules, offload, packed);
  return offload;
}

// FSDP frees and re-gathers its gathered parameters itself: activation offload leaves them alone.
void keep_gathered_params_in_place(ActivationOffload* offload, Fsdp& fsdp) {
  if (!offload) return;
  std::unordered_set<const c10::StorageImpl*> gathered;
  for (auto* unit : fsdp.units())
    for (auto& p : unit->params) gathered.insert(p.gathered.storage().unsafeGetStorageImpl());
  offload->set_keep_in_place([gathered = std::move(gathered)](const at::Tensor& t) {
    return t.has_storage() && gathered.count(t.storage().unsafeGetStorageImpl()) > 0;
  });
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
  auto offload = apply_recompute_and_offload(model, plan, tiers);
  auto fsdp = std::make_unique<Fsdp>(model, mesh.fsdp(), plan.fsdp, mesh.world()->device(),
                                     FsdpReduction{mesh.replicate(), mesh.dp_size()}, std::move(tiers));
  keep_gathered_params_in_place(offload.get(), *fsdp);
  return fsdp;
}

std::unique_ptr<Fsdp> parallelize(Module& model, const ParallelizePlan& plan, std::shared_ptr<Comm> comm,
                                  at::Device device, std::shared_ptr<OffloadTiers> tiers) {
  auto offload = apply_recompute_and_offload(model, plan, tiers);
  auto fsdp = std::make_unique<Fsdp>(model, std::move(comm), plan.fsdp, device, FsdpReduction{}, std::move(tiers));
  keep_gathered_params_in_place(offload.get(), *fsdp);
  return fsdp;
}

}  // namespace mmtrain
