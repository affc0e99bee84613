// chunked_linear_cross_entropy against the unchunked reference
// cross_entropy(linear(hidden, weight).float(), labels, ignore_index=-100): loss and both grads,
// for chunk sizes that divide N, do not, exceed it, and are 1; with ignored rows; and with none
// supervised. chunked_linear_log_probs against log_softmax(linear(...)).gather(label) under a
// weighted sum (a preference loss's per-sequence sums), values and both grads.
#include "nn/chunked_cross_entropy.h"
#include "test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace mmtrain {
namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).norm() / b.to(at::kDouble).norm().clamp_min(1e-30)).item<double>();
}

struct Result {
  at::Tensor loss, grad_hidden, grad_weight;
};

Result run(at::ScalarType dtype, const at::Tensor& labels, int64_t chunk) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto hidden = at::randn({37, 24}, gen).to(dtype).requires_grad_(true);
  auto weight = (at::randn({50, 24}, gen) * 0.3).to(dtype).requires_grad_(true);
  at::Tensor loss = chunk > 0 ? chunked_linear_cross_entropy(hidden, weight, labels, chunk)
                              : at::cross_entropy_loss(at::linear(hidden, weight).to(at::kFloat), labels, {},
                                                       at::Reduction::Mean, -100);
  (loss * 1.7).backward();
  return {loss.detach(), hidden.grad(), weight.grad()};
}

at::Tensor some_ignored_labels() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  auto labels = at::randint(0, 50, {37}, gen, at::kLong);
  labels.narrow(0, 0, 5).fill_(-100);
  labels.narrow(0, 20, 3).fill_(-100);
  return labels;
}

TEST(ChunkedCrossEntropy, MatchesUnchunkedInFp32) {
  const auto labels = some_ignored_labels();
  const auto ref = run(at::kFloat, labels, 0);
  for (int64_t chunk : {1, 5, 8, 37, 100}) {
    const auto got = run(at::kFloat, labels, chunk);
    EXPECT_LE(rel(got.loss, ref.loss), 1e-6) << "chunk " << chunk;
    EXPECT_LE(rel(got.grad_hidden, ref.grad_hidden), 1e-6) << "chunk " << chunk;
    EXPECT_LE(rel(got.grad_weight, ref.grad_weight), 1e-6) << "chunk " << chunk;
  }
}

TEST(ChunkedCrossEntropy, Bf16StaysWithinBf16RoundingOfTheReference) {
  const auto labels = some_ignored_labels();
  const auto ref32 = run(at::kFloat, labels, 0);
  const auto ref16 = run(at::kBFloat16, labels, 0);
  const auto got = run(at::kBFloat16, labels, 8);
  EXPECT_EQ(got.grad_hidden.scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.grad_weight.scalar_type(), at::kBFloat16);
  // As close to the fp32 truth as the unchunked bf16 path is (within 2x), per output.
  EXPECT_LE(rel(got.loss, ref32.loss), 2 * rel(ref16.loss, ref32.loss) + 1e-3);
  EXPECT_LE(rel(got.grad_hidden, ref32.grad_hidden), 2 * rel(ref16.grad_hidden, ref32.grad_hidden) + 1e-3);
  EXPECT_LE(rel(got.grad_weight, ref32.grad_weight), 2 * rel(ref16.grad_weight, ref32.grad_weight) + 1e-3);
}

TEST(ChunkedCrossEntropy, NothingSupervisedGivesZeroLossAndGrads) {
  const auto got = run(at::kFloat, at::full({37}, -100, at::kLong), 8);
  EXPECT_EQ(got.loss.item<double>(), 0.0);
  EXPECT_EQ(got.grad_hidden.abs().max().item<double>(), 0.0);
  EXPECT_EQ(got.grad_weight.abs().max().item<double>(), 0.0);
}

TEST(ChunkedCrossEntropy, RefusesBadShapes) {
  auto h = at::zeros({4, 3}), w = at::zeros({5, 2});
  EXPECT_CONTAINS(mmtrain::testing::error_of([&] { chunked_linear_cross_entropy(h, w, at::zeros({4}, at::kLong), 2); }),
                  "expected hidden [N, H] and weight [V, H]");
  EXPECT_CONTAINS(mmtrain::testing::error_of([&] {
                    chunked_linear_cross_entropy(h, at::zeros({5, 3}), at::zeros({4}, at::kLong), 0);
                  }),
                  "chunk_rows must be >= 1");
}

// Each row's log p(label) (0 on ignored rows), weighted per row as a preference loss weights its
// sequences' sums: the chunked values and grads against the unchunked autograd reference.
TEST(ChunkedLogProbs, MatchUnchunkedLogSoftmaxAndTheirGrads) {
  const auto labels = some_ignored_labels();
  const auto keep = labels != -100;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto row_weights = at::randn({37}, gen);
  auto inputs = [] {
    auto g = at::make_generator<at::CPUGeneratorImpl>(3);
    auto hidden = at::randn({37, 24}, g).requires_grad_(true);
    auto weight = (at::randn({50, 24}, g) * 0.3).requires_grad_(true);
    return std::make_pair(hidden, weight);
  };
  auto [ref_hidden, ref_weight] = inputs();
  const auto log_probs = at::log_softmax(at::linear(ref_hidden, ref_weight), -1);
  const auto ref = at::where(keep, log_probs.gather(1, at::where(keep, labels, 0).unsqueeze(1)).squeeze(1), 0.0);
  (ref * row_weights).sum().backward();
  for (int64_t chunk : {1, 8, 37, 100}) {
    auto [hidden, weight] = inputs();
    const auto got = chunked_linear_log_probs(hidden, weight, labels, chunk);
    EXPECT_EQ(got.sizes(), ref.sizes());
    EXPECT_TRUE(at::equal(got.detach().eq(0), ref.detach().eq(0))) << "ignored rows are 0, chunk " << chunk;
    EXPECT_LE(rel(got.detach(), ref.detach()), 1e-6) << "chunk " << chunk;
    (got * row_weights).sum().backward();
    EXPECT_LE(rel(hidden.grad(), ref_hidden.grad()), 1e-6) << "chunk " << chunk;
    EXPECT_LE(rel(weight.grad(), ref_weight.grad()), 1e-6) << "chunk " << chunk;
  }
}

}  // namespace
}  // namespace mmtrain
