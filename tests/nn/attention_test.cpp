// The varlen attention op against a naive float64 softmax, per sample: forward, log-sum-exp and
// the grads of q, k and v within 1e-6 in fp32, for grouped-query heads, causal and full
// attention, 1 to 4 packed samples of odd lengths. And the property ring attention rests on:
// attention split into blocks of keys, merged through the log-sum-exp (forward) and given the
// final out and lse (backward), equals attention over the whole.
#include "nn/attention.h"

#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

namespace mmtrain {
namespace {

constexpr int64_t kHq = 4, kHkv = 2, kD = 8;

struct Inputs {
  at::Tensor q, k, v;
};

Inputs random_inputs(int64_t rows, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randn({rows, kHq, kD}, gen).requires_grad_(true), at::randn({rows, kHkv, kD}, gen).requires_grad_(true),
          at::randn({rows, kHkv, kD}, gen).requires_grad_(true)};
}

// The reference: every segment's softmax in float64, with explicit loops over samples and heads.
struct Reference {
  at::Tensor out, lse;  // [T, Hq, d], [Hq, T] float64
};
Reference naive(const Inputs& in, const std::vector<int64_t>& cu, bool causal) {
  const int64_t rows = in.q.size(0), group = kHq / kHkv;
  auto q = in.q.to(at::kDouble), k = in.k.to(at::kDouble), v = in.v.to(at::kDouble);
  std::vector<at::Tensor> outs, lses;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t b = cu[s], n = cu[s + 1] - b;
    std::vector<at::Tensor> head_out, head_lse;
    for (int64_t h = 0; h < kHq; ++h) {
      auto qs = q.narrow(0, b, n).select(1, h), ks = k.narrow(0, b, n).select(1, h / group);
      auto vs = v.narrow(0, b, n).select(1, h / group);
      auto scores = at::matmul(qs, ks.t()) / std::sqrt(static_cast<double>(kD));
      if (causal) scores = scores.masked_fill(at::ones({n, n}, at::kBool).triu(1), -INFINITY);
      auto lse = at::logsumexp(scores, 1);
      head_out.push_back(at::matmul(at::exp(scores - lse.unsqueeze(1)), vs));
      head_lse.push_back(lse);
    }
    outs.push_back(at::stack(head_out, 1));
    lses.push_back(at::stack(head_lse, 0));
  }
  EXPECT_EQ(cu.back(), rows);
  return {at::cat(outs, 0), at::cat(lses, 1)};
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kDouble) - b).abs().max().item<double>(); }

struct Case {
  std::vector<int64_t> cu;
  bool causal;
};

class VarlenAttention : public ::testing::TestWithParam<Case> {};

TEST_P(VarlenAttention, MatchesNaiveSoftmaxAndItsGradients) {
  const auto& c = GetParam();
  const auto in = random_inputs(c.cu.back(), 7 + c.cu.size());
  const auto got = varlen_attention(in.q, in.k, in.v, c.cu, c.causal);
  const auto ref = naive(in, c.cu, c.causal);
  EXPECT_LE(max_diff(got.out, ref.out), 1e-6);
  EXPECT_LE(max_diff(got.lse, ref.lse), 1e-6);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto grad_out = at::randn(got.out.sizes(), gen);
  const auto grads = torch::autograd::grad({got.out}, {in.q, in.k, in.v}, {grad_out});
  const auto ref_grads = torch::autograd::grad({ref.out}, {in.q, in.k, in.v}, {grad_out.to(at::kDouble)});
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) EXPECT_LE(max_diff(grads[i], ref_grads[i].to(at::kDouble)), 1e-6) << names[i];
}

INSTANTIATE_TEST_SUITE_P(Samples, VarlenAttention,
                         ::testing::Values(Case{{0, 13}, false}, Case{{0, 13}, true}, Case{{0, 5, 17}, false},
                                           Case{{0, 5, 17}, true}, Case{{0, 3, 10, 11, 20}, false},
                                           Case{{0, 3, 10, 11, 20}, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(info.param.cu.size() - 1) + "_samples_" +
                                  (info.param.causal ? "causal" : "full");
                         });

// Keys of one sample cut into blocks: the blocks merged through their log-sum-exp give the
// attention over all keys, in forward and backward.
TEST(AttentionSegments, KeyBlocksMergeToTheWhole) {
  const int64_t n = 19;
  const auto in = random_inputs(n, 11);
  const auto whole = attention_segments(in.q, in.k, in.v, {{0, n, 0, n, false}});
  const auto blocks = attention_segments(in.q, in.k, in.v, {{0, n, 0, 6, false}, {0, n, 6, 9, false}, {0, n, 15, 4, false}});
  EXPECT_LE((whole.out - blocks.out).abs().max().item<double>(), 1e-6);
  EXPECT_LE((whole.lse - blocks.lse).abs().max().item<double>(), 1e-5);

  const auto grad_out = at::ones_like(whole.out);
  const auto a = torch::autograd::grad({whole.out}, {in.q, in.k, in.v}, {grad_out});
  const auto b = torch::autograd::grad({blocks.out}, {in.q, in.k, in.v}, {grad_out});
  for (int i = 0; i < 3; ++i) EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-5) << i;
}

// Causal attention as a ring sees it: the second half of the rows against the first half fully,
// and each half against itself causally.
TEST(AttentionSegments, CausalBlocksMergeToTheCausalWhole) {
  const int64_t n = 16, half = 8;
  const auto in = random_inputs(n, 13);
  const auto whole = attention_segments(in.q, in.k, in.v, {{0, n, 0, n, true}});
  const auto blocks = attention_segments(
      in.q, in.k, in.v, {{0, half, 0, half, true}, {half, half, 0, half, false}, {half, half, half, half, true}});
  EXPECT_LE((whole.out - blocks.out).abs().max().item<double>(), 1e-6);
  const auto a = torch::autograd::grad({whole.out}, {in.q, in.k, in.v}, {at::ones_like(whole.out)});
  const auto b = torch::autograd::grad({blocks.out}, {in.q, in.k, in.v}, {at::ones_like(blocks.out)});
  for (int i = 0; i < 3; ++i) EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-5) << i;
}

TEST(AttentionSegments, RowsOutsideEverySegmentAreZero) {
  const auto in = random_inputs(10, 17);
  const auto got = attention_segments(in.q, in.k, in.v, {{0, 6, 0, 6, false}});  // rows 6..9: padding
  EXPECT_EQ(got.out.narrow(0, 6, 4).abs().max().item<double>(), 0.0);
  EXPECT_TRUE(std::isinf(got.lse.narrow(1, 6, 4).max().item<double>()));
  const auto grads = torch::autograd::grad({got.out}, {in.k}, {at::ones_like(got.out)});
  EXPECT_EQ(grads[0].narrow(0, 6, 4).abs().max().item<double>(), 0.0);
}

TEST(AttentionSegments, BadInputsNameTheProblem) {
  const auto in = random_inputs(10, 19);
  EXPECT_THROW(attention_segments(in.q, in.k, in.v, {{0, 6, 2, 9, false}}), Error);   // k rows out of range
  EXPECT_THROW(attention_segments(in.q, in.k, in.v, {{0, 6, 0, 5, true}}), Error);    // causal, not square
  EXPECT_THROW(varlen_attention(in.q, in.k, in.v, {0, 4, 9}, false), Error);          // does not end at T
  EXPECT_THROW(varlen_attention(in.q, in.k.narrow(1, 0, 1).expand({10, 3, kD}), in.v, {0, 10}, false), Error);
}

}  // namespace
}  // namespace mmtrain
