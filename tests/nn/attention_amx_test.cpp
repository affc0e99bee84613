// The AMX attention backward (nn/attention_amx.h) against the grads of a float64 softmax of the
// same bf16 inputs, next to ATen's CPU flash attention backward given the same out and lse: dq,
// dk and dv must be as close to float64 as ATen's are (both round p and ds to bf16 for their
// GEMMs and their results once). Shapes cover one partial query block, several blocks and key chunks
// with odd tails, fewer queries than keys (a ring block), grouped and plain heads, head dims 64
// and 128. Skipped on a CPU without AMX bf16 tile GEMMs.
#include "nn/attention.h"
#include "nn/attention_amx.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

namespace mmtrain {
namespace {

struct Shape {
  int64_t ql, kl, hq, hkv, d;
};

struct Grads {
  at::Tensor dq, dk, dv;
};

// The grads of a float64 softmax attention of the bf16 inputs, through autograd.
Grads float64_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out) {
  const int64_t group = q.size(1) / k.size(1);
  auto qd = q.to(at::kDouble).requires_grad_(true), kd = k.to(at::kDouble).requires_grad_(true);
  auto vd = v.to(at::kDouble).requires_grad_(true);
  auto scores = at::einsum("qhd,khd->hqk", {qd, kd.repeat_interleave(group, 1)}) / std::sqrt(double(q.size(2)));
  auto out = at::einsum("hqk,khd->qhd", {at::softmax(scores, -1), vd.repeat_interleave(group, 1)});
  const auto grads = torch::autograd::grad({out}, {qd, kd, vd}, {grad_out.to(at::kDouble)});
  return {grads[0], grads[1], grads[2]};
}

at::Tensor heads(const at::Tensor& rows) { return rows.transpose(0, 1).unsqueeze(0); }  // [n, H, d] -> [1, H, n, d]
at::Tensor rows(const at::Tensor& heads) { return heads.squeeze(0).transpose(0, 1); }

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  return ((got.to(at::kDouble) - want).norm() / want.norm()).item<double>();
}

class AmxAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(AmxAttention, IsAsCloseToFloat64AsAtenFlashAttention) {
  const auto s = GetParam();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(s.ql * 31 + s.kl);
  auto q = at::randn({s.ql, s.hq, s.d}, gen).to(at::kBFloat16);
  if (!amx_attention_backward_usable(q, /*causal=*/false)) GTEST_SKIP() << "no AMX bf16 tile GEMMs or AVX-512 on this CPU";
  auto k = at::randn({s.kl, s.hkv, s.d}, gen).to(at::kBFloat16);
  auto v = at::randn({s.kl, s.hkv, s.d}, gen).to(at::kBFloat16);
  auto grad_out = at::randn({s.ql, s.hq, s.d}, gen).to(at::kBFloat16);
  const double scale = 1.0 / std::sqrt(double(s.d));

  const auto want = float64_reference(q, k, v, grad_out);
  // The forward both backwards take: ATen's (the trainer's forward).
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(heads(q), heads(k), heads(v), 0.0, false);
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(heads(grad_out), heads(q), heads(k),
                                                                               heads(v), out, lse, 0.0, false);
  const Grads aten{rows(dq), rows(dk), rows(dv)};
  Grads ours;
  std::tie(ours.dq, ours.dk, ours.dv) = amx_attention_backward(grad_out, q, k, v, rows(out), lse.squeeze(0), scale);

  const char* names[] = {"dq", "dk", "dv"};
  const at::Tensor Grads::*fields[] = {&Grads::dq, &Grads::dk, &Grads::dv};
  for (int i = 0; i < 3; ++i) {
    const double e_ours = rel_error(ours.*fields[i], want.*fields[i]);
    const double e_aten = rel_error(aten.*fields[i], want.*fields[i]);
    EXPECT_EQ((ours.*fields[i]).sizes(), (want.*fields[i]).sizes()) << names[i];
    // bf16 outputs are ~2e-3 from float64 (one rounding); 1.25x ATen's error, or within 1e-4 of it.
    EXPECT_LE(e_ours, std::max(1.25 * e_aten, e_aten + 1e-4)) << names[i] << ": ATen " << e_aten;
    EXPECT_LT(e_ours, 1e-2) << names[i];
    std::printf("%s %s: ours %.3e, ATen %.3e\n", ::testing::UnitTest::GetInstance()->current_test_info()->name(), names[i], e_ours, e_aten);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AmxAttention,
                         ::testing::Values(Shape{45, 45, 8, 2, 128}, Shape{300, 300, 4, 4, 64},
                                           Shape{130, 517, 8, 2, 128}, Shape{64, 3, 2, 1, 64}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const auto& s = info.param;
                           return "q" + std::to_string(s.ql) + "_k" + std::to_string(s.kl) + "_h" +
                                  std::to_string(s.hq) + "x" + std::to_string(s.hkv) + "_d" + std::to_string(s.d);
                         });

// The op every model calls takes the kernel's backward for bf16 full attention.
TEST(AmxAttention, VarlenAttentionUsesItsBackwardForFullBf16Segments) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto q = at::randn({70, 4, 64}, gen).to(at::kBFloat16).requires_grad_(true);
  if (!amx_attention_backward_usable(q, false)) GTEST_SKIP() << "no AMX bf16 tile GEMMs or AVX-512 on this CPU";
  auto k = at::randn({70, 2, 64}, gen).to(at::kBFloat16).requires_grad_(true);
  auto v = at::randn({70, 2, 64}, gen).to(at::kBFloat16).requires_grad_(true);
  const auto got = varlen_attention(q, k, v, {0, 29, 70}, /*causal=*/false);
  const auto grad_out = at::randn(got.out.sizes(), gen).to(at::kBFloat16);
  const auto grads = torch::autograd::grad({got.out}, {q, k, v}, {grad_out});
  for (auto [b, n] : {std::pair<int64_t, int64_t>{0, 29}, {29, 41}}) {
    at::NoGradGuard no_grad;
    const auto [dq, dk, dv] = amx_attention_backward(grad_out.narrow(0, b, n), q.narrow(0, b, n), k.narrow(0, b, n),
                                                     v.narrow(0, b, n), got.out.narrow(0, b, n),
                                                     got.lse.narrow(1, b, n), 0.125);
    EXPECT_TRUE(at::equal(grads[0].narrow(0, b, n), dq));
    EXPECT_TRUE(at::equal(grads[1].narrow(0, b, n), dk));
    EXPECT_TRUE(at::equal(grads[2].narrow(0, b, n), dv));
  }
}

}  // namespace
}  // namespace mmtrain
