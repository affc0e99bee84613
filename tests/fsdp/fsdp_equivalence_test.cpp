// FSDP on 2 and 4 ranks (threads + Gloo) against the same engine on 1 rank: same model, same
// batches, same optimizer. Per-step loss and final parameters must agree to 1e-5 relative in
// fp32, for every prefetch depth, with and without recompute, with gradient accumulation.
#include "fsdp/fully_shard.h"
#include "models/test_transformer/model.h"
#include "multirank_harness.h"
#include "optim/adamw.h"
#include "parallel/parallelize.h"
#include "train/build.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <mutex>

namespace mmtrain {
namespace {

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;  // full fp32 params after the last step
  FsdpMemoryStats rank0_stats;
  int64_t rank0_optimizer_bytes = 0;
};

const nlohmann::json kModelConfig = {{"vocab_size", 96}, {"hidden_size", 32}, {"num_layers", 3},
                                     {"num_heads", 4},   {"num_kv_heads", 2}, {"ffn_hidden_size", 72}};
constexpr int64_t kSeqLen = 17;
constexpr int kGlobalBatch = 8;

at::Tensor all_samples() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  return at::randint(0, 96, {64, kSeqLen}, gen, at::kLong);
}

// Trains `steps` optimizer steps with a global batch of kGlobalBatch samples split over
// world ranks and `accum` micro-batches, as the trainer's sampler does.
RunResult train(int world, int accum, const ParallelizePlan& plan, int steps) {
  RunResult result;
  std::mutex mutex;
  const auto samples = all_samples();
  testing::run_ranks(world, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto model = make_test_transformer(kModelConfig);
    auto fsdp_ptr = parallelize(*model, plan, comm);
    auto& fsdp = *fsdp_ptr;
    fsdp.init_params(7);
    auto adamw_ptr = make_fsdp_adamw(fsdp, AdamWOptions{0.9, 0.95, 1e-8, 0.1});
    StateFiniteness finiteness;
    auto& adamw = *adamw_ptr;
    const int micro = kGlobalBatch / (world * accum);
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      const StepSettings settings{step + 1, accum, 3e-3, 1.0};
      const auto stats = train_step(*model, fsdp, adamw, finiteness, settings, [&](int m) {
        const int64_t begin = (step * kGlobalBatch + (m * world + comm->rank()) * micro) % samples.size(0);
        return Batch{{"tokens", samples.narrow(0, begin, micro)}};
      });
      losses.push_back(comm->all_reduce_sum(stats.loss_sum) / (accum * world));
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (comm->rank() == 0) {
      result.losses = losses;
      result.rank0_stats = fsdp.memory_stats();
      result.rank0_optimizer_bytes = adamw.state_bytes();
    }
    testing::add_shard_rows(fsdp, comm->rank(), result.params);
  });
  return result;
}

void expect_close(const RunResult& a, const RunResult& b, double rtol) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], rtol * std::abs(b.losses[i])) << "step " << i;
  ASSERT_EQ(a.params.size(), b.params.size());
  // Relative L2 per tensor: Adam divides by sqrt(v), so single elements with near-zero grads
  // amplify summation-order rounding (batch of 8 vs 2 x 4) far beyond their share of the norm.
  for (const auto& [name, tensor] : b.params) {
    auto diff = (a.params.at(name) - tensor).norm().item<double>();
    auto scale = tensor.norm().item<double>();
    EXPECT_LE(diff, rtol * scale) << name << " max abs diff "
                                  << (a.params.at(name) - tensor).abs().max().item<double>();
  }
}

ParallelizePlan layer_units(int prefetch, bool recompute) {
  ParallelizePlan plan;
  plan.fsdp.apply_modules = {"layers.{*}"};
  plan.fsdp.num_to_forward_prefetch = plan.fsdp.num_to_backward_prefetch = prefetch;
  if (recompute) plan.recompute_modules = {"layers.{*}"};
  return plan;
}

constexpr int kSteps = 20;

TEST(FsdpEquivalence, LossFallsAndRanksAgree) {
  auto single = train(1, 1, layer_units(1, false), kSteps);
  EXPECT_LT(single.losses.back(), single.losses.front() - 0.1) << "the model must actually learn";
  for (int world : {2, 4}) {
    for (int prefetch : {0, 1, 2}) {
      for (bool recompute : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "world " << world << " prefetch " << prefetch
                                          << " recompute " << recompute);
        expect_close(train(world, 1, layer_units(prefetch, recompute), kSteps), single, 1e-5);
      }
    }
  }
}

TEST(FsdpEquivalence, GradientAccumulation) {
  auto single = train(1, 2, layer_units(1, false), kSteps);
  expect_close(train(2, 2, layer_units(1, true), kSteps), single, 1e-5);
  expect_close(train(4, 2, layer_units(2, false), kSteps), single, 1e-5);
  // Accumulating 2 micro-batches of 4 equals one batch of 8.
  expect_close(train(1, 1, layer_units(1, false), kSteps), single, 1e-5);
}

TEST(FsdpEquivalence, ShardedBytesAreAboutOneOverW) {
  auto full = train(1, 1, layer_units(1, false), 1);
  auto sharded = train(4, 1, layer_units(1, false), 1);
  const double total = full.rank0_stats.param_bytes;
  // Padding to ceil(dim0 / W) rows costs at most one row per parameter.
  EXPECT_NEAR(sharded.rank0_stats.param_bytes, total / 4, 0.02 * total);
  EXPECT_NEAR(sharded.rank0_stats.grad_bytes, total / 4, 0.02 * total);
  EXPECT_NEAR(sharded.rank0_optimizer_bytes, 2 * total / 4, 0.04 * total);
  EXPECT_EQ(full.rank0_optimizer_bytes, 2 * full.rank0_stats.param_bytes);
}

TEST(FsdpEquivalence, MixedPrecisionBf16StaysCloseToFp32) {
  auto fp32 = train(2, 1, layer_units(1, false), 5);
  auto plan = layer_units(1, false);
  plan.fsdp.param_dtype = at::kBFloat16;
  auto bf16 = train(2, 1, plan, 5);
  for (size_t i = 0; i < fp32.losses.size(); ++i) EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 0.02 * fp32.losses[i]);
}

}  // namespace
}  // namespace mmtrain
