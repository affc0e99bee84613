// The Llama-family ops on CPU (nn/ops.h: rms_norm, apply_rope, silu_mul, which run the fused
// kernels of nn/fused_ops.h) against their ATen compositions (*_aten, HF's op order), the oracle:
// fp32 forwards bitwise where fused_ops.h claims it, gradients against the composition's
// autograd, and a float64 central-difference check of each fused backward.
#include "nn/ops.h"
#include "numeric_checks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace mmtrain {
namespace {

using Op = testing::TensorFn;

using testing::rel_l2;

// Output and input gradients of sum(op(inputs) * probe), probe a fixed random cotangent.
std::vector<at::Tensor> run(const Op& op, std::vector<at::Tensor> inputs, const at::Tensor& probe) {
  for (auto& t : inputs) t = t.detach().clone().requires_grad_(true);
  auto out = op(inputs);
  auto grads = torch::autograd::grad({(out * probe.to(out.scalar_type())).sum()}, inputs);
  grads.insert(grads.begin(), out.detach());
  return grads;
}

// d/d inputs of sum(op * probe) by central differences in double, at 7 elements of each input.
void expect_matches_finite_differences(const Op& op, const std::vector<at::Tensor>& inputs, const at::Tensor& probe) {
  testing::expect_gradients_match_central_differences(op, inputs, probe, 7, "fused op");
}

struct Case {
  Op fused, aten;
  std::vector<at::Tensor> inputs;
  at::Tensor probe;
};

void expect_fused_matches_aten(const Case& c, bool forward_bitwise, double grad_rel) {
  const auto fused = run(c.fused, c.inputs, c.probe), aten = run(c.aten, c.inputs, c.probe);
  if (forward_bitwise) {
    EXPECT_TRUE(at::equal(fused[0], aten[0])) << "forward differs: rel " << rel_l2(fused[0], aten[0]);
  } else {
    EXPECT_LE(rel_l2(fused[0], aten[0]), 1e-6);
  }
  for (size_t k = 1; k < fused.size(); ++k) EXPECT_LE(rel_l2(fused[k], aten[k]), grad_rel) << "grad of input " << k - 1;
}

at::Generator generator() { return at::make_generator<at::CPUGeneratorImpl>(17); }

TEST(FusedLlamaOps, RmsNorm) {
  auto gen = generator();
  const double eps = 1e-6;
  // Odd sizes: the kernels' vector loops and their tails.
  auto x = at::randn({129, 67}, gen) * 3, w = at::randn({67}, gen), probe = at::randn({129, 67}, gen);
  Case c{[&](auto& t) { return rms_norm(t[0], t[1], eps); }, [&](auto& t) { return rms_norm_aten(t[0], t[1], eps); },
         {x, w}, probe};
  expect_fused_matches_aten(c, /*forward_bitwise=*/true, 1e-6);
  expect_matches_finite_differences(c.fused, {x.narrow(0, 0, 5), w}, probe.narrow(0, 0, 5));
  // bf16: one rounding where the reference rounds twice.
  auto xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16);
  EXPECT_LE(rel_l2(rms_norm(xb, wb, eps), rms_norm_aten(xb, wb, eps)), 8e-3);
}

TEST(FusedLlamaOps, RotateHalfRope) {
  auto gen = generator();
  const int64_t batch = 2, seq = 7, heads = 3, hd = 16;
  auto [cos, sin] = rope_tables(at::arange(seq, at::kFloat) * 3.5, hd, 10000.0);
  auto x = at::randn({batch, seq, heads, hd}, gen), probe = at::randn({batch, seq, heads, hd}, gen);
  Case c{[&](auto& t) { return apply_rope(t[0], cos, sin); }, [&](auto& t) { return apply_rope_aten(t[0], cos, sin); },
         {x}, probe};
  expect_fused_matches_aten(c, /*forward_bitwise=*/true, 1e-7);
  expect_matches_finite_differences(c.fused, {x}, probe);
  // [T, heads, hd] with one table row per token (Mistral3's packed stream).
  auto x3 = x[0];
  EXPECT_TRUE(at::equal(apply_rope(x3, cos, sin), apply_rope_aten(x3, cos, sin)));
}

TEST(FusedLlamaOps, SiluMul) {
  auto gen = generator();
  auto g = at::randn({33, 70}, gen) * 4, u = at::randn({33, 70}, gen), probe = at::randn({33, 70}, gen);
  Case c{[](auto& t) { return silu_mul(t[0], t[1]); }, [](auto& t) { return silu_mul_aten(t[0], t[1]); }, {g, u}, probe};
  expect_fused_matches_aten(c, /*forward_bitwise=*/false, 1e-6);
  expect_matches_finite_differences(c.fused, {g.narrow(0, 0, 3), u.narrow(0, 0, 3)}, probe.narrow(0, 0, 3));
}

}  // namespace
}  // namespace mmtrain

namespace mmtrain {
namespace {

// Timing at the transformer bench's shapes (bench/fsdp_vs_torch.sh, hidden 1024, seq 512), forward
// + backward, fused vs the ATen composition, best of 5, one thread. Not run by default:
//   OMP_NUM_THREADS=1 mmtrain_tests --gtest_also_run_disabled_tests --gtest_filter='FusedLlamaOps.DISABLED_Timing'
TEST(FusedLlamaOps, DISABLED_Timing) {
  using Clock = std::chrono::steady_clock;
  auto best_ms = [](const Op& op, const std::vector<at::Tensor>& inputs) {
    std::vector<at::Tensor> leaves;
    for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = Clock::now();
      auto y = op(leaves);
      torch::autograd::grad({y}, leaves, {at::ones_like(y)});
      best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    return best;
  };
  auto report = [&](const char* name, const Op& fused, const Op& aten, const std::vector<at::Tensor>& inputs) {
    const double f = best_ms(fused, inputs), a = best_ms(aten, inputs);
    std::printf("%-28s fused %7.2f ms  aten %7.2f ms  (x%.2f)\n", name, f, a, a / f);
  };
  auto x = at::randn({512, 1024}), w = at::randn({1024});
  report("rms_norm [512, 1024]", [](auto& t) { return rms_norm(t[0], t[1], 1e-6); },
         [](auto& t) { return rms_norm_aten(t[0], t[1], 1e-6); }, {x, w});
  auto [cos, sin] = rope_tables(at::arange(512, at::kFloat), 64, 10000.0);
  auto q = at::randn({1, 512, 16, 64});
  report("apply_rope [1, 512, 16, 64]", [&](auto& t) { return apply_rope(t[0], cos, sin); },
         [&](auto& t) { return apply_rope_aten(t[0], cos, sin); }, {q});
  auto g = at::randn({512, 2816}), u = at::randn({512, 2816});
  report("silu_mul [512, 2816]", [](auto& t) { return silu_mul(t[0], t[1]); },
         [](auto& t) { return silu_mul_aten(t[0], t[1]); }, {g, u});
}

}  // namespace
}  // namespace mmtrain
