// The rewards GRPO trains from (training.grpo.reward_funcs): each scores a batch of completions,
// one finite number each. Built in (nn/grpo_loss.h's grpo_builtin_rewards; all 0 or 1 but
// overlong_penalty):
//   answer_match      the completion's answer (rl/answer_checks.h) equals the record's answer_field
//                     as normalized text, or as numbers
//   exact_match       the answer equals answer_field exactly (both trimmed)
//   numeric_match     both parse as numbers (ints, decimals, fractions, \frac, \boxed) and are equal
//   regex_match       the completion contains a match of reward_regex (ECMAScript)
//   think_format      Magistral's [THINK] reasoning [/THINK] answer
//   overlong_penalty  DAPO's soft overlong punishment: 0 up to max_completion_length - overlong_buffer
//                     tokens, then falling linearly to -1 at max_completion_length (TRL's
//                     get_soft_overlong_punishment)
// User-defined (rl/user_rewards.h): "module:function", a Python function over the batch, and
// "command", reward_command's program over JSONL. docs/grpo.md.
#pragma once
#include "nn/grpo_loss.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain::rl {

// One completion as the rewards see it.
struct RewardInput {
  std::string prompt;                   // the prompt's last user message
  std::string completion;               // its text, Magistral's [THINK] and [/THINK] written out
  std::vector<int64_t> completion_ids;  // the generated ids, EOS included when it ended the completion
  bool truncated = false;               // cut at max_completion_length (no EOS)
  nlohmann::json fields;                // the prompt record's other fields ("answer", ...), an object
};

class Reward {
 public:
  explicit Reward(std::string name) : name_(std::move(name)) {}
  virtual ~Reward() = default;
  const std::string& name() const { return name_; }
  // One reward per input; fails naming the reward and why (a user function that raised, hung,
  // returned the wrong count or a non-finite value).
  virtual std::vector<double> score(const std::vector<RewardInput>& batch) const = 0;

 private:
  std::string name_;
};

// config.reward_funcs' rewards, in order.
std::vector<std::unique_ptr<Reward>> make_rewards(const GrpoConfig& config);

// Whether config's rewards read the prompt records' answer_field.
bool rewards_read_answers(const GrpoConfig& config);

}  // namespace mmtrain::rl
