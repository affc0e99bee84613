// The numeric comparisons every test shares: one relative L2 error, one central-difference
// gradient check.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace mmtrain::testing {

// ||actual - reference|| / max(||reference||, 1e-10), in float64: the seeds' definition.
double rel_l2(const at::Tensor& actual, const at::Tensor& reference);

using TensorFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

// The gradients autograd gives for sum(op(inputs) * cotangent) against central differences
// (float64, h = 1e-6), at up to `points` evenly spread elements of every input (0: all of them):
// |analytic - numeric| <= 1e-6 * max(1, |numeric|). Inputs are taken in float64.
void expect_gradients_match_central_differences(const TensorFn& op, const std::vector<at::Tensor>& inputs,
                                                const at::Tensor& cotangent, int64_t points, const std::string& what);

}  // namespace mmtrain::testing
