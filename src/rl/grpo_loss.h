// GRPO's clipped surrogate loss over a micro-batch of completions, as TRL's GRPOTrainer computes it
// (trl 1.16, importance_sampling_level "token"). Per completion token t of completion i, with
// A_i its advantage (rl/advantages.h) and log π the policy's log-prob of the token at the sampling
// temperature:
//   r_t   = exp(log π(t) - log π_old(t))          (π_old: the rollout's policy; 1 when μ = 1)
//   L_t   = -min(r_t A_i, clip(r_t, 1 - ε, 1 + ε_high) A_i) + β KL_t
//   KL_t  = exp(log π_ref(t) - log π(t)) - (log π_ref(t) - log π(t)) - 1      (k3; only when β > 0)
// and the micro-batch's loss by loss_type, m_t the completion mask (0 on a masked truncated one):
//   grpo     mean over completions i of (Σ_t m_t L_t / max(1, Σ_t m_t))
//   bnpo     Σ m_t L_t / max(1, Σ m_t)                     over the micro-batch's tokens
//   dr_grpo  Σ m_t L_t / (completions × max_completion_length)
//   dapo     Σ m_t L_t / (the step's masked tokens over all ranks / (accumulation × dp))
// The step averages micro-batches (÷ accumulation) and data-parallel ranks (FSDP's mean), so dapo's
// is a token mean over the whole step, as TRL's (whose returned loss is the above ÷ accumulation).
// docs/grpo.md.
#pragma once
#include "rl/grpo_config.h"

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

namespace mmtrain {

// A micro-batch's completions over the rows of its token stream, [T] each (the rows the model's
// kTokenLogProbsKey forward scores: row t predicts the next token).
struct GrpoTokens {
  at::Tensor log_probs;      // fp32, with grad: the policy's
  at::Tensor old_log_probs;  // fp32, or undefined: the policy's own, detached (μ = 1)
  at::Tensor ref_log_probs;  // fp32, or undefined when β = 0
  at::Tensor entropies;      // fp32, no grad
  at::Tensor mask;           // fp32: 1 on the completion tokens that train
  at::Tensor completion;     // int64: the completion row t belongs to (any on rows where mask is 0)
  at::Tensor advantages;     // fp32 [completions]
  // dapo: the masked completion tokens of the step's whole global batch / (its micro-batches per
  // rank × data-parallel ranks).
  double dapo_divisor = 1;
};

// The metric sums of a micro-batch (TRL's names; each a Σ over masked tokens, the step divides
// them by kGrpoTokenCountMetric): kl (when β > 0), entropy, clip_ratio/low_mean, high_mean,
// region_mean.
inline constexpr const char* kGrpoTokenCountMetric = "completion_tokens";
const std::vector<std::string>& grpo_token_metric_names(const GrpoConfig& config);

struct GrpoLoss {
  at::Tensor loss;  // scalar, with grad
  std::map<std::string, double> metric_sums;  // the names above and kGrpoTokenCountMetric
};

GrpoLoss grpo_loss(const GrpoConfig& config, const GrpoTokens& tokens);

}  // namespace mmtrain
