// dpo_loss against a naive loop over the pairs in double, written from the formulas of
// nn/preference_loss.h (TRL 1.16's DPOTrainer): each loss type alone and a weighted sum with rpo's
// sft term; the gradient with respect to the policy's log-probs against central differences of the
// loop; the metric sums; a token-budget step's pair normalizer; Flow-DPO's form against its formula;
// and the settings the section refuses.
#include "nn/preference_loss.h"

#include "core/config_schema.h"
#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mmtrain {
namespace {

constexpr int64_t kPairs = 5;

struct Inputs {
  std::vector<double> chosen, rejected, ref_chosen, ref_rejected, chosen_tokens, rejected_tokens;
};

Inputs inputs() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto draw = [&](double scale, double shift) {
    const auto t = (at::randn({kPairs}, gen, at::kDouble) * scale + shift).contiguous();
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + kPairs);
  };
  Inputs in{draw(3, -20), draw(3, -22), draw(3, -21), draw(3, -21), {}, {}};
  in.chosen_tokens = {4, 7, 1, 9, 3};
  in.rejected_tokens = {5, 2, 8, 6, 3};
  return in;
}

double log_sigmoid(double x) { return -std::log1p(std::exp(-x)); }

// The formulas, one pair at a time.
double naive_loss(const DpoConfig& c, const Inputs& in) {
  std::vector<std::string> types = c.loss_type;
  std::vector<double> weights = c.loss_weights.empty() ? std::vector<double>(types.size(), 1.0) : c.loss_weights;
  if (c.rpo_alpha > 0) {
    types.push_back("sft");
    weights.push_back(c.rpo_alpha);
  }
  double chosen_sum = 0, chosen_tokens = 0;
  for (int64_t i = 0; i < kPairs; ++i) chosen_sum += in.chosen[i], chosen_tokens += in.chosen_tokens[i];
  double total = 0;
  for (size_t k = 0; k < types.size(); ++k) {
    double mean = 0;
    for (int64_t i = 0; i < kPairs; ++i) {
      const double w = in.chosen[i] - in.ref_chosen[i], l = in.rejected[i] - in.ref_rejected[i], delta = w - l;
      const double normalized = w / in.chosen_tokens[i] - l / in.rejected_tokens[i];
      const double b = c.beta, e = c.label_smoothing;
      double loss = 0;
      if (types[k] == "sigmoid") loss = -log_sigmoid(b * delta);
      if (types[k] == "hinge") loss = std::max(0.0, 1 - b * delta);
      if (types[k] == "ipo") loss = std::pow(normalized - 1 / (2 * b), 2);
      if (types[k] == "sigmoid_norm") loss = -log_sigmoid(b * normalized);
      if (types[k] == "robust") loss = (-(1 - e) * log_sigmoid(b * delta) + e * log_sigmoid(-b * delta)) / (1 - 2 * e);
      if (types[k] == "sft") loss = -chosen_sum / chosen_tokens;
      mean += loss / kPairs;
    }
    total += weights[k] * mean;
  }
  return total;
}

PairLogProbs tensors(const Inputs& in) {
  auto t = [](const std::vector<double>& v) { return at::tensor(v, at::kDouble).to(at::kFloat); };
  return {t(in.chosen).requires_grad_(true), t(in.rejected).requires_grad_(true), t(in.ref_chosen),
          t(in.ref_rejected), t(in.chosen_tokens), t(in.rejected_tokens)};
}

DpoConfig config(std::vector<std::string> types, double beta = 0.3) {
  DpoConfig c;
  c.loss_type = std::move(types);
  c.beta = beta;
  return c;
}

TEST(DpoLoss, EachLossTypeAndItsGradientMatchTheFormulas) {
  auto robust = config({"robust"});
  robust.label_smoothing = 0.2;
  auto mixed = config({"sigmoid", "ipo"}, 0.1);
  mixed.loss_weights = {0.7, 2.0};
  mixed.rpo_alpha = 0.5;
  for (const auto& c : {config({"sigmoid"}), config({"hinge"}, 0.05), config({"ipo"}), config({"sigmoid_norm"}), robust,
                        config({"sft"}), mixed}) {
    const std::string name = c.loss_type[0] + (c.loss_type.size() > 1 ? "+" : "");
    const Inputs in = inputs();
    auto p = tensors(in);
    const auto got = dpo_loss(c, p);
    EXPECT_NEAR(got.loss.item<double>(), naive_loss(c, in), 2e-6 * std::max(1.0, std::abs(naive_loss(c, in)))) << name;
    got.loss.backward();
    for (int64_t i = 0; i < kPairs; ++i)
      for (auto [side, grad] : {std::pair{0, p.chosen.grad()}, std::pair{1, p.rejected.grad()}}) {
        auto plus = in, minus = in;
        const double h = 1e-4;
        (side == 0 ? plus.chosen : plus.rejected)[i] += h;
        (side == 0 ? minus.chosen : minus.rejected)[i] -= h;
        const double numeric = (naive_loss(c, plus) - naive_loss(c, minus)) / (2 * h);
        const double got_grad = grad.defined() ? grad[i].item<double>() : 0.0;  // sft: no grad to the rejected
        EXPECT_NEAR(got_grad, numeric, 1e-4) << name << " pair " << i << " side " << side;
      }
  }
}

TEST(DpoLoss, MetricSumsAreTrlsOverThePairs) {
  const Inputs in = inputs();
  const auto c = config({"sigmoid"}, 0.5);
  const auto got = dpo_loss(c, tensors(in));
  double chosen = 0, rejected = 0, accuracies = 0, margins = 0, logps_chosen = 0, logps_rejected = 0;
  for (int64_t i = 0; i < kPairs; ++i) {
    const double w = 0.5 * (in.chosen[i] - in.ref_chosen[i]), l = 0.5 * (in.rejected[i] - in.ref_rejected[i]);
    chosen += w, rejected += l, accuracies += w > l, margins += w - l;
    logps_chosen += in.chosen[i], logps_rejected += in.rejected[i];
  }
  const auto& m = got.metric_sums;
  EXPECT_NEAR(m.at("rewards/chosen"), chosen, 1e-5);
  EXPECT_NEAR(m.at("rewards/rejected"), rejected, 1e-5);
  EXPECT_EQ(m.at("rewards/accuracies"), accuracies);
  EXPECT_NEAR(m.at("rewards/margins"), margins, 1e-5);
  EXPECT_NEAR(m.at("logps/chosen"), logps_chosen, 1e-4);
  EXPECT_NEAR(m.at("logps/rejected"), logps_rejected, 1e-4);
  EXPECT_EQ(m.at(kPairCountMetric), kPairs);
  EXPECT_GT(accuracies, 0);  // the draw has pairs both ways
  EXPECT_LT(accuracies, kPairs);
}

TEST(DpoLoss, APairNormalizerMakesTheMeanASumOverTheGlobalPairs) {
  // A token-budget step: this micro-batch's kPairs of a global batch of 12 pairs.
  const Inputs in = inputs();
  auto c = config({"sigmoid", "sft"});
  const double global_pairs = 12;
  const double got = dpo_loss(c, tensors(in), global_pairs).loss.item<double>();
  EXPECT_NEAR(got, naive_loss(c, in) * kPairs / global_pairs, 2e-6);
}

// Flow-DPO: the clips' errors e stand in for -log π, β/2 for β (nn/preference_loss.h).
TEST(FlowDpoLoss, MatchesTheFormulaWithItsMetrics) {
  const Inputs in = inputs();
  auto error = [](const std::vector<double>& v) {  // errors about 1, a difference about 0.1
    std::vector<double> out;
    for (double x : v) out.push_back(1.0 + x / 200.0);
    return out;
  };
  const auto e_w = error(in.chosen), e_l = error(in.rejected), r_w = error(in.ref_chosen), r_l = error(in.ref_rejected);
  auto t = [](const std::vector<double>& v) { return at::tensor(v, at::kDouble).to(at::kFloat); };
  PairFlowErrors e{t(e_w).requires_grad_(true), t(e_l), t(r_w), t(r_l)};
  const double beta = 500;
  auto c = config({"sigmoid", "sft"}, beta);
  c.loss_weights = {1.0, 0.3};
  const auto got = flow_dpo_loss(c, e);
  double loss = 0, margins = 0, accuracies = 0, mse_chosen = 0;
  for (int64_t i = 0; i < kPairs; ++i) {
    const double inside = -beta / 2 * ((e_w[i] - r_w[i]) - (e_l[i] - r_l[i]));
    loss += (-log_sigmoid(inside) + 0.3 * e_w[i]) / kPairs;
    const double reward_w = beta / 2 * (r_w[i] - e_w[i]), reward_l = beta / 2 * (r_l[i] - e_l[i]);
    margins += reward_w - reward_l, accuracies += reward_w > reward_l, mse_chosen += e_w[i];
  }
  EXPECT_NEAR(got.loss.item<double>(), loss, 1e-5 * std::max(1.0, loss));
  EXPECT_NEAR(got.metric_sums.at("rewards/margins"), margins, 1e-3);
  EXPECT_EQ(got.metric_sums.at("rewards/accuracies"), accuracies);
  EXPECT_NEAR(got.metric_sums.at("mse/chosen"), mse_chosen, 1e-5);
  EXPECT_EQ(got.metric_sums.count("logps/chosen"), 0u);
  for (const auto& type : {"ipo", "sigmoid_norm"}) EXPECT_THROW(flow_dpo_loss(config({type}), e), Error) << type;
}

TEST(DpoLoss, TheSectionRefusesWhatItCannotCompute) {
  auto load = [](const std::string& yaml) {
    ConfigSchema schema;
    struct Root {
      DpoConfig dpo;
    } root;
    schema.root<Root>().section("dpo", &Root::dpo, DpoConfig::declare);
    schema.load(&root, yaml, "t.yaml", {});
    return root.dpo;
  };
  EXPECT_EQ(load("dpo: {beta: 0.2, loss_type: [sigmoid, sft], loss_weights: [1, 0.5]}").loss_weights.size(), 2u);
  for (const char* bad : {"dpo: {beta: 0}", "dpo: {loss_type: [kto]}", "dpo: {loss_type: []}",
                          "dpo: {loss_type: [sigmoid], loss_weights: [1, 2]}", "dpo: {label_smoothing: 0.5}",
                          "dpo: {rpo_alpha: -1}", "dpo: {term_weights: [1, -1]}", "dpo: {reference_quant: nf8}"})
    EXPECT_THROW(load(bad), Error) << bad;
}

}  // namespace
}  // namespace mmtrain
