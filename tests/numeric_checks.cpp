#include "numeric_checks.h"

#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace mmtrain::testing {

double rel_l2(const at::Tensor& actual, const at::Tensor& reference) {
  const auto ref = reference.to(at::kDouble);
  return (actual.to(at::kDouble) - ref).norm().item<double>() / std::max(ref.norm().item<double>(), 1e-10);
}

void expect_gradients_match_central_differences(const TensorFn& op, const std::vector<at::Tensor>& inputs,
                                                const at::Tensor& cotangent, int64_t points, const std::string& what) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().to(at::kDouble).clone().requires_grad_(true));
  const auto probe = cotangent.to(at::kDouble);
  const auto analytic = torch::autograd::grad({(op(leaves) * probe).sum()}, leaves);
  const double h = 1e-6;
  for (size_t k = 0; k < leaves.size(); ++k) {
    const int64_t n = leaves[k].numel();
    const int64_t stride = points > 0 ? std::max<int64_t>(1, n / points) : 1;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i += stride) {
      auto loss_at = [&](double delta) {
        std::vector<at::Tensor> args;
        for (const auto& leaf : leaves) args.push_back(leaf.detach());
        args[k] = args[k].clone();
        args[k].view(-1)[i] += delta;
        at::NoGradGuard no_grad;
        return (op(args) * probe).sum().item<double>();
      };
      const double numeric = (loss_at(h) - loss_at(-h)) / (2 * h);
      const double got = analytic[k].view(-1)[i].item<double>();
      worst = std::max(worst, std::abs(got - numeric) / std::max(1.0, std::abs(numeric)));
    }
    EXPECT_LE(worst, 1e-6) << what << ": input " << k << " analytic vs central differences";
  }
}

}  // namespace mmtrain::testing
