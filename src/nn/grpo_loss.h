// The training.grpo section (GRPO, Shao et al. 2024, with verifiable rewards; TRL GRPOConfig's
// names) and GRPO's clipped surrogate loss over a micro-batch of completions, as TRL's
// GRPOTrainer computes it (trl 1.16, importance_sampling_level "token"). Per completion token t of completion i, with
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
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct GrpoConfig {
  // Rollouts: each prompt's G completions, sampled at this temperature and top-p.
  int64_t num_generations = 8;          // G, >= 2 (a group of one has no baseline)
  int64_t max_completion_length = 256;  // tokens a completion may have (EOS included); longer ones are cut (truncated)
  double temperature = 1.0;             // > 0; the per-token log-probs are of softmax(logits / temperature)
  double top_p = 1.0;
  // Keep the whole model gathered while a rollout generates (TRL's ds3_gather_for_generation):
  // one gather per rollout instead of one per generated token, for the model's params in
  // param_dtype held on every rank meanwhile; false gathers unit by unit for every token.
  bool gather_for_generation = true;
  // Optimizer steps per rollout (μ): steps 2..μ reuse it, their ratios against its old log-probs.
  int64_t num_iterations = 1;
  double epsilon = 0.2;       // the ratio is clipped to [1 - epsilon, 1 + epsilon_high]
  double epsilon_high = -1;   // < 0: epsilon (symmetric); DAPO's clip-higher sets it above epsilon
  double beta = 0.0;          // the k3 KL estimator's weight; 0 skips the reference forward
  std::string loss_type = "dapo";      // grpo | bnpo | dr_grpo | dapo: how token losses are summed and normalized
  std::string scale_rewards = "group"; // group | batch | none: what the advantages are divided by
  bool mask_truncated_completions = false;  // a completion cut at max_completion_length trains no token

  // Rewards, summed with reward_weights (one each; default all 1). A name is a built-in reward
  // (grpo_builtin_rewards; rl/rewards.h computes them), "command" (reward_command), or a Python
  // "module:function".
  std::vector<std::string> reward_funcs = {"answer_match"};
  std::vector<double> reward_weights;
  std::string answer_field = "answer";   // the prompt record's field the answer rewards compare with
  std::string reward_regex;              // regex_match: the pattern a completion must contain
  int64_t overlong_buffer = 0;           // overlong_penalty: the last tokens before max_completion_length penalized (DAPO)
  std::vector<std::string> reward_command;  // "command": argv of a program reading and writing JSONL
  std::vector<std::string> reward_python_path;  // directories a Python reward's module is imported from
  double reward_timeout_s = 120;         // a user reward's limit per call
  int64_t log_completions = 4;           // completions a step writes to rollouts/iter_N.jsonl's console and TensorBoard

  // epsilon_high as set, or epsilon.
  double clip_high() const { return epsilon_high < 0 ? epsilon : epsilon_high; }
  static void declare(ConfigSection<GrpoConfig>& section);
};

// The built-in rewards' names (rl/rewards.h), and "" when `name` names a reward (a built-in,
// "command", or "module:function" of Python identifiers), else what a name must be.
const std::vector<std::string>& grpo_builtin_rewards();
std::string grpo_reward_name_problem(const std::string& name);

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
