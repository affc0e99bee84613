#include "rl/grpo_loss.h"

#include "core/error.h"

#include <algorithm>

namespace mmtrain {

namespace {

double sum_of(const at::Tensor& t) { return t.detach().to(at::kDouble).sum().item<double>(); }

}  // namespace

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
