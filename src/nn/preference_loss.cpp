#include "nn/preference_loss.h"

#include "core/config_schema.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace mmtrain {

namespace {

const std::vector<std::string> kLossTypes = {"sigmoid", "hinge", "ipo", "sigmoid_norm", "robust", "sft"};

double sum_of(const at::Tensor& t) { return t.detach().to(at::kDouble).sum().item<double>(); }

}  // namespace

void DpoConfig::declare(ConfigSection<DpoConfig>& s) {
  s.field("beta", &DpoConfig::beta)
      .field("loss_type", &DpoConfig::loss_type)
      .field("loss_weights", &DpoConfig::loss_weights)
      .field("label_smoothing", &DpoConfig::label_smoothing)
      .field("rpo_alpha", &DpoConfig::rpo_alpha)
      .field("term_weights", &DpoConfig::term_weights)
      .field("reference_quant", &DpoConfig::reference_quant)
      .check([](const DpoConfig& c, const ConfigCheck& check) {
        const auto number = ConfigCheck::number;
        if (!(c.beta > 0.0) || !std::isfinite(c.beta)) check.invalid("beta", "a positive number", number(c.beta));
        if (c.loss_type.empty()) check.invalid("loss_type", "one or more of the loss types", "an empty list");
        for (const auto& type : c.loss_type) check.one_of("loss_type", type, kLossTypes);
        if (!c.loss_weights.empty() && c.loss_weights.size() != c.loss_type.size())
          check.invalid("loss_weights", "one weight per loss_type (" + std::to_string(c.loss_type.size()) + ")",
                        std::to_string(c.loss_weights.size()) + " weights");
        for (double w : c.loss_weights)
          if (!std::isfinite(w)) check.invalid("loss_weights", "finite numbers", number(w));
        if (!(c.label_smoothing >= 0.0 && c.label_smoothing < 0.5))
          check.invalid("label_smoothing", "in [0, 0.5) (the robust loss divides by 1 - 2 x label_smoothing)",
                        number(c.label_smoothing));
        if (!(c.rpo_alpha >= 0.0) || !std::isfinite(c.rpo_alpha))
          check.invalid("rpo_alpha", ">= 0 (0: no SFT term)", number(c.rpo_alpha));
        check.one_of("reference_quant", c.reference_quant, {"none", "nf4", "int8", "fp8_e4m3"});
        for (double w : c.term_weights)
          if (!(w >= 0.0) || !std::isfinite(w)) check.invalid("term_weights", "finite numbers >= 0", number(w));
      });
}

const std::vector<std::string>& dpo_metric_names(bool flow) {
  static const std::vector<std::string> names = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                                 "rewards/margins", "logps/chosen", "logps/rejected", kPairCountMetric};
  static const std::vector<std::string> flow_names = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                                      "rewards/margins", "mse/chosen", "mse/rejected", kPairCountMetric};
  return flow ? flow_names : names;
}

const std::vector<std::string>& flow_dpo_loss_types() {
  static const std::vector<std::string> types = {"sigmoid", "hinge", "robust", "sft"};
  return types;
}

DpoLoss flow_dpo_loss(const DpoConfig& config, const PairFlowErrors& e, std::optional<double> pair_normalizer) {
  for (const auto& type : config.loss_type)
    if (std::find(flow_dpo_loss_types().begin(), flow_dpo_loss_types().end(), type) == flow_dpo_loss_types().end())
      fail("flow_dpo_loss: loss_type '", type, "' has no Flow-DPO form");
  // -e stands in for log π, β/2 for β; each clip counts as one "token" so that sft is the mean e(w).
  DpoConfig half = config;
  half.beta = config.beta / 2.0;
  PairLogProbs p;
  p.chosen = -e.chosen;
  p.rejected = -e.rejected;
  p.ref_chosen = -e.ref_chosen;
  p.ref_rejected = -e.ref_rejected;
  p.chosen_tokens = at::ones_like(e.chosen.detach());
  p.rejected_tokens = at::ones_like(e.rejected.detach());
  DpoLoss out = dpo_loss(half, p, pair_normalizer);
  out.metric_sums.erase("logps/chosen");
  out.metric_sums.erase("logps/rejected");
  out.metric_sums["mse/chosen"] = sum_of(e.chosen);
  out.metric_sums["mse/rejected"] = sum_of(e.rejected);
  return out;
}

DpoLoss dpo_loss(const DpoConfig& c, const PairLogProbs& p, std::optional<double> pair_normalizer) {
  const int64_t pairs = p.chosen.size(0);
  if (pairs == 0 || p.rejected.size(0) != pairs || p.ref_chosen.size(0) != pairs || p.ref_rejected.size(0) != pairs)
    fail("dpo_loss: expected the same positive number of chosen and rejected sequences, got ", p.chosen.sizes(), " and ",
         p.rejected.sizes());
  const auto chosen_ratio = p.chosen - p.ref_chosen;        // [P]
  const auto rejected_ratio = p.rejected - p.ref_rejected;  // [P]
  const auto delta = chosen_ratio - rejected_ratio;
  const double beta = c.beta, eps = c.label_smoothing;
  // The length-normalized difference of ipo and sigmoid_norm (each answer at least one token).
  auto normalized_delta = [&] {
    return chosen_ratio / p.chosen_tokens.clamp_min(1.0) - rejected_ratio / p.rejected_tokens.clamp_min(1.0);
  };
  std::vector<std::string> types = c.loss_type;
  std::vector<double> weights = c.loss_weights.empty() ? std::vector<double>(types.size(), 1.0) : c.loss_weights;
  if (c.rpo_alpha > 0.0) {
    types.push_back("sft");
    weights.push_back(c.rpo_alpha);
  }
  at::Tensor loss = at::zeros({}, p.chosen.options());
  for (size_t k = 0; k < types.size(); ++k) {
    const auto& type = types[k];
    at::Tensor per_pair;
    if (type == "sigmoid") {
      per_pair = -at::log_sigmoid(beta * delta);
    } else if (type == "hinge") {
      per_pair = at::relu(1.0 - beta * delta);
    } else if (type == "ipo") {
      per_pair = at::pow(normalized_delta() - 1.0 / (2.0 * beta), 2);
    } else if (type == "sigmoid_norm") {
      per_pair = -at::log_sigmoid(beta * normalized_delta());
    } else if (type == "robust") {
      per_pair = (-(1.0 - eps) * at::log_sigmoid(beta * delta) + eps * at::log_sigmoid(-beta * delta)) / (1.0 - 2.0 * eps);
    } else if (type == "sft") {
      per_pair = (-p.chosen.sum() / p.chosen_tokens.sum().clamp_min(1.0)).expand({pairs});
    } else {
      fail("dpo_loss: unknown loss_type '", type, "'");
    }
    loss = loss + (pair_normalizer ? per_pair.sum() / *pair_normalizer : per_pair.mean()) * weights[k];
  }
  DpoLoss out;
  out.loss = loss;
  const auto chosen_rewards = beta * chosen_ratio.detach(), rejected_rewards = beta * rejected_ratio.detach();
  out.metric_sums = {{"rewards/chosen", sum_of(chosen_rewards)},
                     {"rewards/rejected", sum_of(rejected_rewards)},
                     {"rewards/accuracies", sum_of((chosen_rewards > rejected_rewards).to(at::kFloat))},
                     {"rewards/margins", sum_of(chosen_rewards - rejected_rewards)},
                     {"logps/chosen", sum_of(p.chosen)},
                     {"logps/rejected", sum_of(p.rejected)},
                     {kPairCountMetric, static_cast<double>(pairs)}};
  return out;
}

}  // namespace mmtrain
