// The training.grpo section: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath)
// with verifiable rewards, names as TRL's GRPOConfig (trl 1.16) where it has them. docs/grpo.md.
#pragma once
#include <cstdint>
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
  // Optimizer steps per rollout (μ): steps 2..μ reuse it, their ratios against its old log-probs.
  int64_t num_iterations = 1;
  double epsilon = 0.2;       // the ratio is clipped to [1 - epsilon, 1 + epsilon_high]
  double epsilon_high = -1;   // < 0: epsilon (symmetric); DAPO's clip-higher sets it above epsilon
  double beta = 0.0;          // the k3 KL estimator's weight; 0 skips the reference forward
  std::string loss_type = "dapo";      // grpo | bnpo | dr_grpo | dapo: how token losses are summed and normalized
  std::string scale_rewards = "group"; // group | batch | none: what the advantages are divided by
  bool mask_truncated_completions = false;  // a completion cut at max_completion_length trains no token

  // Rewards, summed with reward_weights (one each; default all 1). A name is a built-in reward
  // (rl/rewards.h), "command" (reward_command), or a Python "module:function".
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

}  // namespace mmtrain
