// GRPO's advantages from the rewards of a global batch of groups (TRL's GRPOTrainer, trl 1.16,
// multi_objective_aggregation "sum_then_normalize"), fp32:
//   r_i = Σ_k w_k r_ik                      (reward function k's reward of completion i)
//   A_i = (r_i - mean of i's group) / (s_i + 1e-4)     s_i: scale_rewards group: the group's std,
//                                                     batch: the whole batch's std, none: no division
// Standard deviations are unbiased (torch.std). The completions are in groups of G consecutive ones.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace mmtrain::rl {

struct GroupAdvantages {
  at::Tensor rewards;     // fp32 [N]: r_i
  at::Tensor advantages;  // fp32 [N]: A_i
  at::Tensor std_zero;    // bool [N]: whether the std A_i would be divided by is (close to) 0
};

// rewards_per_func fp32 [N, K], N a multiple of group_size (>= 2); weights [K].
GroupAdvantages group_advantages(const at::Tensor& rewards_per_func, const std::vector<double>& weights,
                                 int64_t group_size, const std::string& scale_rewards);

}  // namespace mmtrain::rl
