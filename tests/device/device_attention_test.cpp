// Varlen attention (nn/attention.h) on the run's device (tests/device/run_device.h) against the
// per-sample path: every packed sample alone through ATen's scaled_dot_product_attention, in
// float64 on the CPU, grouped-query k/v expanded. At the real models' head shapes (head dim 128,
// GQA 40:8 as MagiHuman's, scaled down in heads) and several packed samples of odd lengths,
// causal and full, forward, log-sum-exp and the grads of q, k and v. On CUDA the inputs are bf16
// (ATen's flash kernels) and the bound is bf16's; on the CPU fp32 (ATen's CPU flash kernel).
#include "nn/attention.h"
#include "run_device.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

namespace mmtrain {
namespace {

constexpr int64_t kHq = 10, kHkv = 2, kD = 128;

// max |a - b| / max |b|: one relative figure for a whole tensor.
double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const auto ref = b.to(at::kDouble).cpu();
  return (a.to(at::kDouble).cpu() - ref).abs().max().item<double>() / ref.abs().max().item<double>();
}

class DeviceAttention : public ::testing::TestWithParam<bool> {};

TEST_P(DeviceAttention, PackedSamplesMatchEachSampleAlone) {
  const bool causal = GetParam();
  const at::Device device = testing::run_device();
  const auto dtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;
  const double bound = device.is_cuda() ? 2e-2 : 1e-5;
  const std::vector<int64_t> cu = {0, 37, 38, 141, 260};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const int64_t rows = cu.back();
  // The inputs, rounded once to the device dtype; the reference starts from the same values.
  auto q0 = at::randn({rows, kHq, kD}, gen).to(dtype), k0 = at::randn({rows, kHkv, kD}, gen).to(dtype);
  auto v0 = at::randn({rows, kHkv, kD}, gen).to(dtype), grad_out = at::randn({rows, kHq, kD}, gen).to(dtype);

  auto q = q0.to(device).requires_grad_(true), k = k0.to(device).requires_grad_(true);
  auto v = v0.to(device).requires_grad_(true);
  const auto got = varlen_attention(q, k, v, cu, causal);
  const auto grads = torch::autograd::grad({got.out}, {q, k, v}, {grad_out.to(device)});

  // The per-sample path, float64 on the CPU.
  auto qr = q0.to(at::kDouble).requires_grad_(true), kr = k0.to(at::kDouble).requires_grad_(true);
  auto vr = v0.to(at::kDouble).requires_grad_(true);
  std::vector<at::Tensor> outs, lses;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t b = cu[s], n = cu[s + 1] - b;
    auto heads = [&](const at::Tensor& t) {  // [n, H, d] -> [1, Hq, n, d], kv heads expanded
      return t.narrow(0, b, n).repeat_interleave(kHq / t.size(1), 1).transpose(0, 1).unsqueeze(0);
    };
    const auto qs = heads(qr), ks = heads(kr), vs = heads(vr);
    outs.push_back(at::scaled_dot_product_attention(qs, ks, vs, {}, 0.0, causal).squeeze(0).transpose(0, 1));
    auto scores = at::matmul(qs, ks.transpose(-1, -2)).squeeze(0) / std::sqrt(static_cast<double>(kD));
    if (causal) scores = scores.masked_fill(at::ones({n, n}, at::kBool).triu(1), -INFINITY);
    lses.push_back(at::logsumexp(scores, -1).detach());  // [Hq, n]
  }
  const auto ref_out = at::cat(outs, 0);
  const auto ref_grads = torch::autograd::grad({ref_out}, {qr, kr, vr}, {grad_out.to(at::kDouble)});

  EXPECT_EQ(got.out.device(), device);
  EXPECT_EQ(got.out.scalar_type(), dtype);
  EXPECT_LE(relative_error(got.out, ref_out), bound) << "out";
  EXPECT_LE(relative_error(got.lse, at::cat(lses, 1)), bound) << "lse";
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) EXPECT_LE(relative_error(grads[i], ref_grads[i]), bound) << names[i];
}

INSTANTIATE_TEST_SUITE_P(Masks, DeviceAttention, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "causal" : "full"; });

}  // namespace
}  // namespace mmtrain
