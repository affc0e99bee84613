// Fused MagiHuman kernels (fused_ops.h) against the reference ATen ops (ops.h), the oracle:
// forwards in ulps (bitwise where fused_ops.h claims it), gradients of every input against the
// reference's autograd, a float64 central-difference check of each fused backward, and the same
// bits with 1 and 2 threads. Inputs reach beyond the ±7 clamps and hit them exactly.
#include "core/error.h"
#include "models/magihuman/ops.h"
#include "nn/fused_ops.h"
#include "numeric_checks.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace mmtrain::magihuman {
namespace {

using testing::rel_l2;
using testing::TensorFn;

// Largest distance in units in the last place between two fp32, bf16 or fp16 tensors.
int64_t max_ulp(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.scalar_type(), b.scalar_type());
  EXPECT_EQ(a.sizes(), b.sizes());
  auto ordered = [](const at::Tensor& t) {
    const bool wide = t.scalar_type() == at::kFloat;
    auto bits = t.contiguous().view(wide ? at::kInt : at::kShort).to(at::kLong);
    auto magnitude = bits.bitwise_and(wide ? 0x7fffffff : 0x7fff);
    return at::where(bits < 0, -magnitude, magnitude);  // monotone in the value; ±0 both map to 0
  };
  if (a.numel() == 0) return 0;
  return (ordered(a) - ordered(b)).abs().max().item<int64_t>();
}

int64_t count_different(const at::Tensor& a, const at::Tensor& b) { return (a != b).sum().item<int64_t>(); }

// Uniform in [-range, range) plus, for the activations, values exactly on and next to the clamps.
at::Tensor activation_input(std::vector<int64_t> shape, at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  auto u = (at::rand(shape, at::kFloat) * 20.0 - 10.0);
  auto flat = u.view({-1});
  const float specials[] = {7.0f, -7.0f, 7.5f, -7.5f, 6.99f, 0.0f, -0.0f, 100.0f, -100.0f};
  for (int64_t i = 0; i < 9 && i < flat.numel(); ++i) flat[i * 37 % flat.numel()] = specials[i];
  return u.to(dtype);
}

// Grads of sum(op(inputs) * cotangent) with respect to every input, on fresh leaf copies.
std::vector<at::Tensor> grads_of(const TensorFn& op, const std::vector<at::Tensor>& inputs, const at::Tensor& cotangent,
                                 at::Tensor* out = nullptr) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  auto y = op(leaves);
  if (out) *out = y.detach();
  auto loss = (y.to(at::kDouble) * cotangent.to(at::kDouble)).sum();
  return torch::autograd::grad({loss}, leaves);
}

// Central differences of sum(op(x) * cotangent) in float64 against the fused backward, at every
// element, for a fixed random cotangent.
void expect_gradcheck(const TensorFn& op, const std::vector<at::Tensor>& inputs, const char* what) {
  at::manual_seed(7);
  const auto cotangent = at::randn(op(inputs).sizes(), at::kDouble);
  testing::expect_gradients_match_central_differences(op, inputs, cotangent, 0, what);
}

// Values in [-10, 10] at least 1e-3 away from the clamp kinks at ±7, where no derivative exists.
at::Tensor smooth_double(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  auto u = at::rand(shape, at::kDouble) * 20.0 - 10.0;
  auto near = (u.abs() - 7.0).abs() < 1e-3;
  return at::where(near, u * 1.01, u);
}

// sin | cos of random angles, [N, 6B] fp32, as fourier_rope lays them out.
at::Tensor random_rope(int64_t n, int64_t bands, uint64_t seed, at::ScalarType dtype = at::kFloat) {
  at::manual_seed(seed);
  auto angles = at::rand({n, 3 * bands}, at::kDouble) * 20.0 - 10.0;
  return at::cat({at::sin(angles), at::cos(angles)}, 1).to(dtype);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm (1 + w)

TEST(FusedRmsNorm1p, ForwardBitwiseEqualToTheReference) {
  at::manual_seed(1);
  auto w = at::randn({256}) * 0.1;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{97, 256}, {31, 5, 256}}) {
      auto x = (at::randn(shape) * 3.0).to(dtype);
      auto got = fused_rms_norm_1p(x, w, 1e-6), want = rms_norm_1p(x, w, 1e-6);
      ASSERT_EQ(got.scalar_type(), dtype);
      const auto ulp = max_ulp(got, want);
      EXPECT_TRUE(at::equal(got, want)) << dtype << " " << x.sizes();
      std::printf("rms_norm_1p %-8s %-14s max %lld ulp, %lld of %lld differ\n", c10::toString(dtype),
                  c10::str(x.sizes()).c_str(), (long long)ulp, (long long)count_different(got, want), (long long)got.numel());
    }
  }
}

TEST(FusedRmsNorm1p, StridedHeadViewsAsTheModelPassesThem) {
  // q = qkv[:, :H*hd].view(L, H, hd): rows are not contiguous in memory
  at::manual_seed(2);
  auto qkv = at::randn({19, 4 * 32 + 40});
  auto q = qkv.slice(1, 0, 4 * 32).view({19, 4, 32});
  auto w = at::randn({32}) * 0.1;
  ASSERT_FALSE(q.is_contiguous());
  EXPECT_TRUE(at::equal(fused_rms_norm_1p(q, w, 1e-6), rms_norm_1p(q, w, 1e-6)));
  auto gy = at::randn({19, 4, 32});
  auto fused = grads_of([](const auto& in) { return fused_rms_norm_1p(in[0].slice(1, 0, 128).view({19, 4, 32}), in[1], 1e-6); }, {qkv, w}, gy);
  auto ref = grads_of([](const auto& in) { return rms_norm_1p(in[0].slice(1, 0, 128).view({19, 4, 32}), in[1], 1e-6); }, {qkv, w}, gy);
  EXPECT_LT(rel_l2(fused[0], ref[0]), 1e-6);
  EXPECT_LT(rel_l2(fused[1], ref[1]), 1e-6);
  EXPECT_EQ(fused[0].slice(1, 128).abs().max().item<float>(), 0.0f);  // the k/v/gate columns get nothing
}

TEST(FusedRmsNorm1p, GradientsMatchTheReferenceAutograd) {
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{300, 512}, {150, 6, 128}}) {
      const int64_t d = shape.back();
      auto x = (at::randn(shape) * 2.0).to(dtype);
      auto w = at::randn({d}) * 0.1;  // fp32 weight, as the model's norms
      auto gy = at::randn(shape).to(dtype);
      auto fused = grads_of([](const auto& in) { return fused_rms_norm_1p(in[0], in[1], 1e-6); }, {x, w}, gy);
      auto ref = grads_of([](const auto& in) { return rms_norm_1p(in[0], in[1], 1e-6); }, {x, w}, gy);
      ASSERT_EQ(fused[0].scalar_type(), dtype);
      ASSERT_EQ(fused[1].scalar_type(), at::kFloat);
      const double dx_err = rel_l2(fused[0], ref[0]), dw_err = rel_l2(fused[1], ref[1]);
      std::printf("rms_norm_1p grads %-8s %-14s dx relL2 %.2e  dw relL2 %.2e\n", c10::toString(dtype),
                  c10::str(x.sizes()).c_str(), dx_err, dw_err);
      EXPECT_LT(dx_err, 1e-6);
      EXPECT_LT(dw_err, 1e-6);
    }
  }
}

TEST(FusedRmsNorm1p, Bf16WeightGetsABf16Gradient) {
  // bf16 parameters (param_dtype bf16): dw is reduced in fp32/double and rounded once to bf16
  at::manual_seed(6);
  auto x = at::randn({200, 128}), w = (at::randn({128}) * 0.1).to(at::kBFloat16), gy = at::randn({200, 128});
  auto fused = grads_of([](const auto& in) { return fused_rms_norm_1p(in[0], in[1], 1e-6); }, {x, w}, gy);
  auto ref = grads_of([](const auto& in) { return rms_norm_1p(in[0], in[1], 1e-6); }, {x, w}, gy);
  ASSERT_EQ(fused[1].scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(fused_rms_norm_1p(x, w, 1e-6), rms_norm_1p(x, w, 1e-6)));
  EXPECT_LT(rel_l2(fused[0], ref[0]), 1e-6);
  EXPECT_LE(max_ulp(fused[1], ref[1]), 1);
}

TEST(FusedRmsNorm1p, Float64CentralDifferences) {
  auto x = smooth_double({3, 2, 8}, 4), w = smooth_double({8}, 5) * 0.05;
  expect_gradcheck([](const auto& in) { return fused_rms_norm_1p(in[0], in[1], 1e-6); }, {x, w}, "rms_norm_1p");
}

TEST(FusedRmsNorm1p, RejectsAWrongWeight) {
  EXPECT_THROW(fused_rms_norm_1p(at::randn({4, 8}), at::randn({7}), 1e-6), Error);
}

// ---------------------------------------------------------------------------------------------
// swiglu7 and gelu7

struct ActivationCase {
  const char* name;
  int64_t in_width, out_width;
  std::function<at::Tensor(const at::Tensor&)> fused, reference;
};

std::vector<ActivationCase> activation_cases() {
  return {{"swiglu7 halves", 2 * 1001, 1001, [](const at::Tensor& u) { return fused_swiglu7(u, false); },
           [](const at::Tensor& u) { return swiglu7(u, false); }},
          {"swiglu7 interleaved", 2 * 1001, 1001, [](const at::Tensor& u) { return fused_swiglu7(u, true); },
           [](const at::Tensor& u) { return swiglu7(u, true); }},
          {"gelu7", 1001, 1001, [](const at::Tensor& u) { return fused_gelu7(u); }, [](const at::Tensor& u) { return gelu7(u); }}};
}

// Random inputs reaching beyond the clamps. With one thread, forward and gradient are bitwise
// equal to the reference. With more, the reference itself sends the last (size mod 32) elements
// of each thread's chunk through the scalar std::exp instead of the vectorised exp, and those few
// elements differ by up to 2 ulp (printed).
TEST(FusedActivations, ForwardAndGradientsMatchTheReference) {
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    for (const auto& c : activation_cases()) {
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        auto u = activation_input({67, c.in_width}, dtype, 11);
        auto go = at::randn({67, c.out_width});
        at::Tensor y_fused, y_ref;
        auto d_fused = grads_of([&](const auto& in) { return c.fused(in[0]); }, {u}, go, &y_fused)[0];
        auto d_ref = grads_of([&](const auto& in) { return c.reference(in[0]); }, {u}, go, &y_ref)[0];
        ASSERT_EQ(y_fused.scalar_type(), at::kFloat);
        ASSERT_EQ(d_fused.scalar_type(), dtype);
        const auto y_ulp = max_ulp(y_fused, y_ref), d_ulp = max_ulp(d_fused, d_ref);
        const auto y_diff = count_different(y_fused, y_ref), d_diff = count_different(d_fused, d_ref);
        std::printf("%d thread(s) %-20s %-8s forward max %lld ulp (%lld of %lld differ), grad max %lld ulp (%lld differ)\n",
                    t, c.name, c10::toString(dtype), (long long)y_ulp, (long long)y_diff, (long long)y_fused.numel(),
                    (long long)d_ulp, (long long)d_diff);
        if (t == 1) {
          EXPECT_EQ(y_diff, 0) << c.name << " " << dtype;
          EXPECT_EQ(d_diff, 0) << c.name << " " << dtype;
        }
        EXPECT_LE(y_ulp, 2) << c.name << " " << dtype;
        EXPECT_LE(d_ulp, 4) << c.name << " " << dtype;
        EXPECT_LE(y_diff, 31 * t) << c.name << " " << dtype;
      }
    }
  }
  at::set_num_threads(threads);
}

TEST(FusedActivations, ClampBoundaryGradientsAsAtClamp) {
  // at::clamp_max passes the gradient where x <= 7 (the boundary included); clamp(-7, 7) where
  // -7 <= x <= 7.
  auto u = at::tensor({7.0f, 7.5f, 1.0f, -7.0f, 7.0f, 1.0f, 1.0f, -7.5f}).view({1, 8});  // halves: gate | linear
  auto leaf = u.clone().requires_grad_(true);
  fused_swiglu7(leaf, false).sum().backward();
  auto g = leaf.grad();
  EXPECT_NE(g[0][0].item<float>(), 0.0f);  // gate == 7
  EXPECT_EQ(g[0][1].item<float>(), 0.0f);  // gate > 7
  EXPECT_NE(g[0][4].item<float>(), 0.0f);  // linear == 7
  EXPECT_EQ(g[0][7].item<float>(), 0.0f);  // linear < -7
  auto leaf2 = u.clone().requires_grad_(true);
  swiglu7(leaf2, false).sum().backward();
  EXPECT_TRUE(at::equal(g, leaf2.grad()));
}

TEST(FusedActivations, Float64CentralDifferences) {
  expect_gradcheck([](const auto& in) { return fused_swiglu7(in[0], false); }, {smooth_double({3, 12}, 21)}, "swiglu7 halves");
  expect_gradcheck([](const auto& in) { return fused_swiglu7(in[0], true); }, {smooth_double({3, 12}, 22)}, "swiglu7 interleaved");
  expect_gradcheck([](const auto& in) { return fused_gelu7(in[0]); }, {smooth_double({3, 7}, 23)}, "gelu7");
}

// ---------------------------------------------------------------------------------------------
// Partial RoPE

TEST(FusedPartialRope, ForwardAndInputGradientBitwise) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(31);
    auto x = at::randn({53, 5, 128}).to(dtype);
    auto rope = random_rope(53, 16, 32);  // 96 of 128 dims rotated
    auto go = at::randn({53, 5, 128});
    at::Tensor y_fused, y_ref;
    auto d_fused = grads_of([](const auto& in) { return fused_partial_rope(in[0], in[1]); }, {x, rope}, go, &y_fused);
    auto d_ref = grads_of([](const auto& in) { return apply_partial_rope(in[0], in[1]); }, {x, rope}, go, &y_ref);
    EXPECT_TRUE(at::equal(y_fused, y_ref)) << dtype;
    ASSERT_EQ(d_fused[0].scalar_type(), dtype);
    if (dtype == at::kFloat)
      EXPECT_TRUE(at::equal(d_fused[0], d_ref[0]));
    else  // the reference rounds each of the two contributions to bf16 before adding them
      EXPECT_LT(rel_l2(d_fused[0], d_ref[0]), 4e-3);
    const double drope_err = rel_l2(d_fused[1], d_ref[1]);
    std::printf("partial_rope %-8s dx relL2 %.2e, drope relL2 %.2e\n", c10::toString(dtype),
                rel_l2(d_fused[0], d_ref[0]), drope_err);
    EXPECT_LT(drope_err, 1e-6);
  }
}

TEST(FusedPartialRope, Float64CentralDifferences) {
  auto x = smooth_double({3, 2, 10}, 41);
  auto rope = random_rope(3, 1, 42, at::kDouble);  // 6 of 10 dims rotated
  expect_gradcheck([](const auto& in) { return fused_partial_rope(in[0], in[1]); }, {x, rope}, "partial_rope");
}

// ---------------------------------------------------------------------------------------------
// Thread-count independence

TEST(FusedOps, SameBitsWithOneAndTwoThreads) {
  const int threads = at::get_num_threads();
  auto run_all = [] {
    std::vector<at::Tensor> outs;
    auto collect = [&](const TensorFn& op, const std::vector<at::Tensor>& in, const at::Tensor& go) {
      at::Tensor y;
      auto g = grads_of(op, in, go, &y);
      outs.push_back(y);
      for (auto& t : g) outs.push_back(t);
    };
    at::manual_seed(51);
    auto x = at::randn({1000, 256}), w = at::randn({256}) * 0.1;
    collect([](const auto& in) { return fused_rms_norm_1p(in[0], in[1], 1e-6); }, {x, w}, at::randn({1000, 256}));
    auto u = activation_input({300, 2 * 600}, at::kFloat, 52);
    collect([](const auto& in) { return fused_swiglu7(in[0], true); }, {u}, at::randn({300, 600}));
    collect([](const auto& in) { return fused_gelu7(in[0]); }, {u}, at::randn({300, 1200}));
    auto q = at::randn({400, 8, 128});
    collect([](const auto& in) { return fused_partial_rope(in[0], in[1]); }, {q, random_rope(400, 16, 53)},
            at::randn({400, 8, 128}));
    return outs;
  };
  at::set_num_threads(1);
  auto one = run_all();
  at::set_num_threads(2);
  auto two = run_all();
  at::set_num_threads(threads);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(at::equal(one[i], two[i])) << "result " << i;
}

// ---------------------------------------------------------------------------------------------
// Timing at realistic shapes, forward + backward, fused vs reference. Not run by default:
//   mmtrain_tests --gtest_also_run_disabled_tests --gtest_filter='FusedOps.DISABLED_Timing'
TEST(FusedOps, DISABLED_Timing) {
  // best of 3 (forward ms, backward ms)
  auto time_ms = [](const TensorFn& op, const std::vector<at::Tensor>& inputs, const at::Tensor& go) {
    std::vector<at::Tensor> leaves;
    for (const auto& t : inputs) leaves.push_back(t.detach().requires_grad_(true));
    using Clock = std::chrono::steady_clock;
    auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    std::pair<double, double> best{1e30, 1e30};
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = Clock::now();
      auto y = op(leaves);
      const auto t1 = Clock::now();
      torch::autograd::grad({y}, leaves, {go});
      const auto t2 = Clock::now();
      best = {std::min(best.first, ms(t0, t1)), std::min(best.second, ms(t1, t2))};
    }
    return best;
  };
  auto report = [&](const char* name, const TensorFn& fused, const TensorFn& ref, const std::vector<at::Tensor>& in,
                    const at::Tensor& go) {
    const auto f = time_ms(fused, in, go), r = time_ms(ref, in, go);
    std::printf("%-34s fwd+bwd fused %7.1f ms reference %7.1f ms (x%.2f); fwd %6.1f vs %6.1f, bwd %6.1f vs %6.1f\n", name,
                f.first + f.second, r.first + r.second, (r.first + r.second) / (f.first + f.second), f.first, r.first,
                f.second, r.second);
  };
  std::printf("threads %d\n", at::get_num_threads());
  auto x = at::randn({4606, 5120}), w = at::randn({5120}) * 0.1;
  report("rms_norm_1p [4606, 5120]", [](const auto& in) { return fused_rms_norm_1p(in[0], in[1], 1e-6); },
         [](const auto& in) { return rms_norm_1p(in[0], in[1], 1e-6); }, {x, w}, at::randn({4606, 5120}));
  auto q = at::randn({4606, 40, 128}), wq = at::randn({128}) * 0.1;
  report("rms_norm_1p q [4606, 40, 128]", [](const auto& in) { return fused_rms_norm_1p(in[0], in[1], 1e-6); },
         [](const auto& in) { return rms_norm_1p(in[0], in[1], 1e-6); }, {q, wq}, at::randn({4606, 40, 128}));
  auto rope = random_rope(4606, 16, 61);
  report("partial_rope [4606, 40, 128]", [](const auto& in) { return fused_partial_rope(in[0], in[1]); },
         [](const auto& in) { return apply_partial_rope(in[0], in[1]); }, {q, rope}, at::randn({4606, 40, 128}));
  x = at::Tensor();
  auto u = activation_input({1024, 2 * 13652}, at::kFloat, 62);
  auto go = at::randn({1024, 13652});
  report("swiglu7 interleaved [1024, 27304]", [](const auto& in) { return fused_swiglu7(in[0], true); },
         [](const auto& in) { return swiglu7(in[0], true); }, {u}, go);
  report("swiglu7 halves [1024, 27304]", [](const auto& in) { return fused_swiglu7(in[0], false); },
         [](const auto& in) { return swiglu7(in[0], false); }, {u}, go);
  auto ug = activation_input({1024, 20480}, at::kFloat, 63);
  report("gelu7 [1024, 20480]", [](const auto& in) { return fused_gelu7(in[0]); },
         [](const auto& in) { return gelu7(in[0]); }, {ug}, at::randn({1024, 20480}));
}

}  // namespace
}  // namespace mmtrain::magihuman
