#include "train/state_finite.h"

#include "core/finite.h"
#include "core/text.h"

namespace mmtrain {
namespace {

// "the weights of 'name' (element i of this rank's shard)" for element `at` of unit's shard_flat.
std::string describe_shard_element(const FsdpUnit& unit, int64_t at) {
  for (const auto& p : unit.params)
    if (!p.frozen && at >= p.offset && at < p.offset + p.layout.shard_numel())
      return "the weights of '" + p.name + "' (element " + std::to_string(at - p.offset) + " of this rank's shard)";
  return "the weights of FSDP unit '" + unit.name + "' (padding element " + std::to_string(at) + ")";
}

}  // namespace

void StateFiniteness::after_step(Fsdp& fsdp, const Optimizer& optimizer, int64_t iteration, double lr, double grad_norm,
                                 const std::function<std::string()>& samples) {
  if (non_finite()) return;  // the first one found is the one to name
  const auto units = fsdp.units();
  std::string what;
  for (const auto* unit : units) {
    if (!fsdp.shard_resident(*unit)) continue;  // paged out to disk: AdamW read it chunk by chunk
    if (const int64_t at = first_non_finite(unit->shard_flat); at >= 0) {
      what = describe_shard_element(*unit, at);
      break;
    }
  }
  if (what.empty())
    if (const auto paged = optimizer.first_non_finite_paged_weight(); paged && paged->param < units.size())
      what = describe_shard_element(*units[paged->param], paged->element);
  if (what.empty()) return;
  found_ = format("iteration %lld: the AdamW step at lr %g (grad norm %g) made ", static_cast<long long>(iteration), lr,
                  grad_norm) + what + " on rank " +
           std::to_string(fsdp.comm().rank()) + " NaN/Inf" + (samples ? ", reading " + samples() : "");
}

std::string describe_non_finite(const std::vector<ShardedTensor>& tensors, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i) {
    const auto& t = tensors[i];
    if (const int64_t at = first_non_finite(t.local); at >= 0)
      return "tensor '" + t.name + "' holds " + std::to_string(t.local.reshape(-1)[at].item<double>()) +
             " (element " + std::to_string(at) + " of rank " + std::to_string(rank) + "'s rows)";
  }
  return "";
}

}  // namespace mmtrain
