#include "rl/grpo_config.h"

#include "core/config_schema.h"
#include "rl/rewards.h"

#include <cmath>

namespace mmtrain {

void GrpoConfig::declare(ConfigSection<GrpoConfig>& s) {
  s.field("num_generations", &GrpoConfig::num_generations)
      .field("max_completion_length", &GrpoConfig::max_completion_length)
      .field("temperature", &GrpoConfig::temperature)
      .field("top_p", &GrpoConfig::top_p)
      .field("num_iterations", &GrpoConfig::num_iterations)
      .field("epsilon", &GrpoConfig::epsilon)
      .field("epsilon_high", &GrpoConfig::epsilon_high)
      .field("beta", &GrpoConfig::beta)
      .field("loss_type", &GrpoConfig::loss_type)
      .field("scale_rewards", &GrpoConfig::scale_rewards)
      .field("mask_truncated_completions", &GrpoConfig::mask_truncated_completions)
      .field("reward_funcs", &GrpoConfig::reward_funcs)
      .field("reward_weights", &GrpoConfig::reward_weights)
      .field("answer_field", &GrpoConfig::answer_field)
      .field("reward_regex", &GrpoConfig::reward_regex)
      .field("overlong_buffer", &GrpoConfig::overlong_buffer)
      .field("reward_command", &GrpoConfig::reward_command)
      .field("reward_python_path", &GrpoConfig::reward_python_path)
      .field("reward_timeout_s", &GrpoConfig::reward_timeout_s)
      .field("log_completions", &GrpoConfig::log_completions)
      .check([](const GrpoConfig& c, const ConfigCheck& check) {
        const auto number = ConfigCheck::number;
        if (c.num_generations < 2)
          check.invalid("num_generations", ">= 2 (the advantage of a completion is its reward against its group's; a "
                        "group of one has none)", std::to_string(c.num_generations));
        if (c.num_generations > 4096) check.invalid("num_generations", "<= 4096", std::to_string(c.num_generations));
        if (c.max_completion_length < 1 || c.max_completion_length > 65536)
          check.invalid("max_completion_length", "in 1..65536", std::to_string(c.max_completion_length));
        if (!(c.temperature > 0) || !std::isfinite(c.temperature))
          check.invalid("temperature", "> 0 (GRPO samples; greedy completions of one prompt would be equal)",
                        number(c.temperature));
        if (!(c.top_p > 0 && c.top_p <= 1)) check.invalid("top_p", "in (0, 1]", number(c.top_p));
        if (c.num_iterations < 1 || c.num_iterations > 64)
          check.invalid("num_iterations", "in 1..64", std::to_string(c.num_iterations));
        if (!(c.epsilon > 0 && c.epsilon < 1)) check.invalid("epsilon", "in (0, 1)", number(c.epsilon));
        if (c.epsilon_high >= 0 && !(c.epsilon_high > 0 && std::isfinite(c.epsilon_high)))
          check.invalid("epsilon_high", "> 0 (or unset: epsilon)", number(c.epsilon_high));
        if (!(c.beta >= 0) || !std::isfinite(c.beta)) check.invalid("beta", ">= 0 (0: no KL term, no reference)", number(c.beta));
        check.one_of("loss_type", c.loss_type, {"grpo", "bnpo", "dr_grpo", "dapo"});
        check.one_of("scale_rewards", c.scale_rewards, {"group", "batch", "none"});
        if (c.reward_funcs.empty()) check.invalid("reward_funcs", "one or more reward functions", "an empty list");
        for (const auto& name : c.reward_funcs) {
          const std::string problem = reward_name_problem(name);
          if (!problem.empty()) check.invalid("reward_funcs", problem, "'" + name + "'");
        }
        if (!c.reward_weights.empty() && c.reward_weights.size() != c.reward_funcs.size())
          check.invalid("reward_weights", "one weight per reward_funcs entry (" + std::to_string(c.reward_funcs.size()) + ")",
                        std::to_string(c.reward_weights.size()) + " weights");
        for (double w : c.reward_weights)
          if (!std::isfinite(w)) check.invalid("reward_weights", "finite numbers", number(w));
        const auto uses = [&](const std::string& name) {
          for (const auto& f : c.reward_funcs)
            if (f == name) return true;
          return false;
        };
        if (uses("regex_match") != !c.reward_regex.empty())
          check.invalid("reward_regex", "set exactly when reward_funcs has regex_match", "'" + c.reward_regex + "'");
        if (uses("command") != !c.reward_command.empty())
          check.invalid("reward_command", "set (argv of the program) exactly when reward_funcs has command",
                        std::to_string(c.reward_command.size()) + " words");
        if (uses("overlong_penalty") != (c.overlong_buffer > 0))
          check.invalid("overlong_buffer", "> 0 exactly when reward_funcs has overlong_penalty",
                        std::to_string(c.overlong_buffer));
        if (c.overlong_buffer >= c.max_completion_length)
          check.invalid("overlong_buffer", "< max_completion_length (" + std::to_string(c.max_completion_length) + ")",
                        std::to_string(c.overlong_buffer));
        if (!(c.reward_timeout_s > 0 && c.reward_timeout_s <= 86400))
          check.invalid("reward_timeout_s", "in (0, 86400] seconds", number(c.reward_timeout_s));
        if (c.log_completions < 0) check.invalid("log_completions", ">= 0", std::to_string(c.log_completions));
      });
}

}  // namespace mmtrain
