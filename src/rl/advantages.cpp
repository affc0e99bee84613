#include "rl/advantages.h"

#include "core/error.h"

namespace mmtrain::rl {

GroupAdvantages group_advantages(const at::Tensor& rewards_per_func, const std::vector<double>& weights,
                                 int64_t group_size, const std::string& scale_rewards) {
  const int64_t n = rewards_per_func.size(0);
  if (rewards_per_func.dim() != 2 || rewards_per_func.size(1) != static_cast<int64_t>(weights.size()))
    fail("group_advantages: rewards [N, ", weights.size(), "] expected, got ", rewards_per_func.sizes());
  if (group_size < 2 || n % group_size != 0)
    fail("group_advantages: ", n, " completions are no whole number of groups of ", group_size);
  GroupAdvantages out;
  const auto w = at::tensor(weights, at::kDouble).to(at::kFloat);
  out.rewards = (rewards_per_func.to(at::kFloat) * w.unsqueeze(0)).sum(1);
  const auto grouped = out.rewards.view({-1, group_size});
  const auto mean = grouped.mean(1).repeat_interleave(group_size);
  at::Tensor std;
  if (scale_rewards == "batch") std = n > 1 ? out.rewards.std().expand({n}) : at::zeros({n}, at::kFloat);
  else std = grouped.std(1).repeat_interleave(group_size);  // group, and none's zero-std count
  out.advantages = out.rewards - mean;
  if (scale_rewards != "none") out.advantages = out.advantages / (std + 1e-4);
  out.std_zero = at::isclose(std, at::zeros_like(std));
  return out;
}

}  // namespace mmtrain::rl
