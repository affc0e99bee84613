#include "nn/grpo_loss.h"

#include "core/config_schema.h"
#include "core/error.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace mmtrain {

namespace {

double sum_of(const at::Tensor& t) { return t.detach().to(at::kDouble).sum().item<double>(); }

bool is_identifier_path(const std::string& s) {  // a.b.c of Python identifiers
  if (s.empty()) return false;
  bool start = true;
  for (const char c : s) {
    if (c == '.') {
      if (start) return false;
      start = true;
      continue;
    }
    if (!(std::isalpha(static_cast<unsigned char>(c)) || c == '_' || (!start && std::isdigit(static_cast<unsigned char>(c)))))
      return false;
    start = false;
  }
  return !start;
}

}  // namespace

const std::vector<std::string>& grpo_builtin_rewards() {
  static const std::vector<std::string> names = {"answer_match", "exact_match", "numeric_match",
                                                 "regex_match",  "think_format", "overlong_penalty"};
  return names;
}

std::string grpo_reward_name_problem(const std::string& name) {
  const auto& builtins = grpo_builtin_rewards();
  if (std::find(builtins.begin(), builtins.end(), name) != builtins.end() || name == "command") return "";
  const auto colon = name.find(':');
  if (colon != std::string::npos && is_identifier_path(name.substr(0, colon)) &&
      is_identifier_path(name.substr(colon + 1)) && name.find('.', colon) == std::string::npos)
    return "";
  std::string listed;
  for (const auto& b : builtins) listed += b + ", ";
  return "a built-in reward (" + listed + "or command) or a Python module:function";
}

void GrpoConfig::declare(ConfigSection<GrpoConfig>& s) {
  s.field("num_generations", &GrpoConfig::num_generations)
      .field("max_completion_length", &GrpoConfig::max_completion_length)
      .field("temperature", &GrpoConfig::temperature)
      .field("top_p", &GrpoConfig::top_p)
      .field("gather_for_generation", &GrpoConfig::gather_for_generation)
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
          const std::string problem = grpo_reward_name_problem(name);
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


const std::vector<std::string>& grpo_token_metric_names(const GrpoConfig& config) {
  static const std::vector<std::string> with_kl = {"kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
                                                   "clip_ratio/region_mean"};
  static const std::vector<std::string> without_kl(with_kl.begin() + 1, with_kl.end());
  return config.beta != 0.0 ? with_kl : without_kl;
}

GrpoLoss grpo_loss(const GrpoConfig& config, const GrpoTokens& in) {
  const int64_t rows = in.log_probs.size(0), completions = in.advantages.size(0);
  for (const at::Tensor* t : {&in.entropies, &in.mask, &in.completion})
    if (t->dim() != 1 || t->size(0) != rows) fail("grpo_loss: every per-token tensor must be [", rows, "], got ", t->sizes());
  if (config.beta != 0.0 && !in.ref_log_probs.defined()) fail("grpo_loss: beta > 0 needs the reference's log-probs");
  const auto& logp = in.log_probs;
  const auto old = in.old_log_probs.defined() ? in.old_log_probs : logp.detach();
  const auto& mask = in.mask;
  // The advantage of each row's completion ([T]; rows outside any completion are masked).
  const auto advantage = in.advantages.index_select(0, in.completion.clamp(0, std::max<int64_t>(completions - 1, 0)));

  const auto ratio = at::exp(logp - old);
  const double low = 1.0 - config.epsilon, high = 1.0 + config.clip_high();
  const auto clipped = at::clamp(ratio, low, high);
  auto per_token = -at::min(ratio * advantage, clipped * advantage);
  at::Tensor kl;
  if (config.beta != 0.0) {
    const auto diff = in.ref_log_probs - logp;
    kl = at::exp(diff) - diff - 1;
    per_token = per_token + config.beta * kl;
  }
  const auto masked = per_token * mask;
  at::Tensor loss;
  if (config.loss_type == "grpo") {
    const auto sums = at::zeros({completions}, masked.options()).index_add(0, in.completion, masked);
    const auto counts = at::zeros({completions}, mask.options()).index_add(0, in.completion, mask);
    loss = (sums / counts.clamp_min(1.0)).mean();
  } else if (config.loss_type == "bnpo") {
    loss = masked.sum() / mask.sum().clamp_min(1.0);
  } else if (config.loss_type == "dr_grpo") {
    loss = masked.sum() / static_cast<double>(completions * config.max_completion_length);
  } else if (config.loss_type == "dapo") {
    loss = masked.sum() / in.dapo_divisor;
  } else {
    fail("grpo_loss: unknown loss_type '", config.loss_type, "'");
  }

  GrpoLoss out;
  out.loss = loss;
  const auto ratio_now = ratio.detach();
  const auto low_clipped = ((ratio_now < low) & (advantage < 0)).to(at::kFloat);
  const auto high_clipped = ((ratio_now > high) & (advantage > 0)).to(at::kFloat);
  if (config.beta != 0.0) out.metric_sums["kl"] = sum_of(kl * mask);
  out.metric_sums["entropy"] = sum_of(in.entropies * mask);
  out.metric_sums["clip_ratio/low_mean"] = sum_of(low_clipped * mask);
  out.metric_sums["clip_ratio/high_mean"] = sum_of(high_clipped * mask);
  out.metric_sums["clip_ratio/region_mean"] = sum_of(at::max(low_clipped, high_clipped) * mask);
  out.metric_sums[kGrpoTokenCountMetric] = sum_of(mask);
  return out;
}

}  // namespace mmtrain
