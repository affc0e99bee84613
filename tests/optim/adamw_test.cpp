// AdamW (optim/adamw.h) against torch.optim.AdamW's update written out per element in double:
//   p <- p * (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// over several steps with changing lr and grads; and the update mask of frozen params.
#include "optim/adamw.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <vector>

namespace mmtrain {
namespace {

struct NaiveAdamW {
  AdamWOptions o;
  std::vector<double> p, m, v;
  int64_t t = 0;
  void step(const std::vector<double>& g, double lr) {
    ++t;
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
    }
  }
};

std::vector<double> values(const at::Tensor& t) {
  auto d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

TEST(AdamW, MatchesTheUpdateRuleOverSteps) {
  const AdamWOptions options{0.9, 0.95, 1e-8, 0.1};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  // Two params of odd sizes: the kernel's vector loop and its tail.
  std::vector<at::Tensor> params = {at::randn({37}, gen), at::randn({5, 13}, gen)};
  std::vector<at::Tensor> grads = {at::zeros({37}), at::zeros({5, 13})};
  AdamW adamw(params, grads, options);
  std::vector<NaiveAdamW> naive;
  for (auto& p : params) naive.push_back({options, values(p), std::vector<double>(p.numel()), std::vector<double>(p.numel())});
  for (int step = 0; step < 6; ++step) {
    const double lr = 1e-2 * (step + 1);
    for (size_t i = 0; i < params.size(); ++i) {
      grads[i].copy_(at::randn(grads[i].sizes(), gen) * (step % 2 ? 1e-3 : 1.0));  // small grads: eps matters
      naive[i].step(values(grads[i]), lr);
    }
    adamw.step(lr);
    for (size_t i = 0; i < params.size(); ++i) {
      const auto got = values(params[i]);
      for (size_t j = 0; j < got.size(); ++j)
        ASSERT_NEAR(got[j], naive[i].p[j], 1e-6 * (1 + std::abs(naive[i].p[j]))) << "param " << i << " element " << j << " step " << step;
    }
  }
  EXPECT_EQ(adamw.step_count(), 6);
}

TEST(AdamW, AnEmptyParamIsSkipped) {  // an FSDP unit whose params are all frozen has an empty shard
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  std::vector<at::Tensor> params = {at::randn({16}, gen), at::zeros({0})};
  std::vector<at::Tensor> grads = {at::randn({16}, gen), at::zeros({0})};
  const auto before = params[0].clone();
  AdamW adamw(params, grads, {0.9, 0.999, 1e-8, 0.1});
  adamw.step(1e-2);
  EXPECT_FALSE(at::equal(params[0], before));
  EXPECT_EQ(adamw.step_count(), 1);
}

TEST(AdamW, RefusesNonFp32Params) {
  std::vector<at::Tensor> params = {at::zeros({4}, at::kBFloat16)}, grads = {at::zeros({4}, at::kBFloat16)};
  EXPECT_THROW(AdamW(params, grads, {}), std::exception);
}

}  // namespace
}  // namespace mmtrain
