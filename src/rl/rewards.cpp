#include "rl/rewards.h"

#include "core/error.h"
#include "rl/answer_checks.h"
#include "rl/user_rewards.h"

#include <algorithm>
#include <functional>
#include <regex>

namespace mmtrain::rl {

namespace {

const std::vector<std::string> kAnswerRewards = {"answer_match", "exact_match", "numeric_match"};

// A reward computed completion by completion.
class PerCompletion : public Reward {
 public:
  PerCompletion(std::string name, std::function<double(const RewardInput&)> fn) : Reward(std::move(name)), fn_(std::move(fn)) {}
  std::vector<double> score(const std::vector<RewardInput>& batch) const override {
    std::vector<double> out;
    for (const auto& input : batch) out.push_back(fn_(input));
    return out;
  }

 private:
  std::function<double(const RewardInput&)> fn_;
};

// The record's answer as text (a number is written as JSON writes it).
std::string answer_of(const RewardInput& input, const std::string& field, const std::string& reward) {
  if (!input.fields.is_object() || !input.fields.contains(field))
    fail("reward ", reward, ": the prompt \"", input.prompt.substr(0, 80), "\" has no field '", field,
         "' (training.grpo.answer_field) to compare with");
  const auto& value = input.fields.at(field);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number()) return value.dump();
  fail("reward ", reward, ": the prompt's field '", field, "' is ", value.type_name(), ", not a string or number");
}

}  // namespace

bool rewards_read_answers(const GrpoConfig& config) {
  for (const auto& name : config.reward_funcs)
    if (std::find(kAnswerRewards.begin(), kAnswerRewards.end(), name) != kAnswerRewards.end()) return true;
  return false;
}

std::vector<std::unique_ptr<Reward>> make_rewards(const GrpoConfig& config) {
  std::vector<std::unique_ptr<Reward>> out;
  const std::string field = config.answer_field;
  for (const auto& name : config.reward_funcs) {
    if (const auto problem = grpo_reward_name_problem(name); !problem.empty())
      fail("training.grpo.reward_funcs: '", name, "' is not ", problem);
    if (name == "answer_match") {
      out.push_back(std::make_unique<PerCompletion>(name, [field, name](const RewardInput& in) {
        const std::string given = completion_answer(in.completion), wanted = answer_of(in, field, name);
        return normalize_answer(given) == normalize_answer(wanted) || numbers_equal(given, wanted) ? 1.0 : 0.0;
      }));
    } else if (name == "exact_match") {
      out.push_back(std::make_unique<PerCompletion>(name, [field, name](const RewardInput& in) {
        const std::string wanted = answer_of(in, field, name);
        const auto trimmed = [](const std::string& s) {
          const auto b = s.find_first_not_of(" \t\r\n");
          return b == std::string::npos ? std::string() : s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
        };
        return completion_answer(in.completion) == trimmed(wanted) ? 1.0 : 0.0;
      }));
    } else if (name == "numeric_match") {
      out.push_back(std::make_unique<PerCompletion>(name, [field, name](const RewardInput& in) {
        return numbers_equal(completion_answer(in.completion), answer_of(in, field, name)) ? 1.0 : 0.0;
      }));
    } else if (name == "regex_match") {
      std::shared_ptr<const std::regex> pattern;
      try {
        pattern = std::make_shared<const std::regex>(config.reward_regex, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        fail("training.grpo.reward_regex '", config.reward_regex, "' is not a valid regex: ", e.what());
      }
      out.push_back(std::make_unique<PerCompletion>(
          name, [pattern](const RewardInput& in) { return std::regex_search(in.completion, *pattern) ? 1.0 : 0.0; }));
    } else if (name == "think_format") {
      out.push_back(std::make_unique<PerCompletion>(
          name, [](const RewardInput& in) { return has_think_format(in.completion) ? 1.0 : 0.0; }));
    } else if (name == "overlong_penalty") {
      const double max_length = static_cast<double>(config.max_completion_length);
      const double buffer = static_cast<double>(config.overlong_buffer);
      out.push_back(std::make_unique<PerCompletion>(name, [max_length, buffer](const RewardInput& in) {
        const double length = static_cast<double>(in.completion_ids.size());
        if (length <= max_length - buffer) return 0.0;
        if (length <= max_length) return (max_length - buffer - length) / buffer;
        return -1.0;
      }));
    } else if (name == "command") {
      out.push_back(make_command_reward(config.reward_command, config.reward_timeout_s));
    } else {
      out.push_back(make_python_reward(name, config.reward_python_path, config.reward_timeout_s));
    }
  }
  return out;
}

}  // namespace mmtrain::rl
