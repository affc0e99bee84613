// A step that makes a weight non-finite stops the run at the next step, on every rank (the check
// rides on that step's grad-norm reduction), the rank holding it naming the tensor, the step, lr,
// grad norm and samples; and finite steps pass the check untouched.
#include "train/train_step.h"

#include "models/test_transformer/model.h"
#include "multirank_harness.h"
#include "parallel/parallelize.h"
#include "test_util.h"
#include "train/build.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <mutex>

namespace mmtrain {
namespace {

const nlohmann::json kModelConfig = {{"vocab_size", 64}, {"hidden_size", 16}, {"num_layers", 2},
                                     {"num_heads", 2},   {"num_kv_heads", 1}, {"ffn_hidden_size", 24}};

// The tiny test transformer, each layer an FSDP unit over comm, initialized from seed 3.
std::pair<std::shared_ptr<Model>, std::unique_ptr<Fsdp>> sharded_test_transformer(const std::shared_ptr<Comm>& comm) {
  auto model = make_test_transformer(kModelConfig);
  ParallelizePlan plan;
  plan.fsdp.apply_modules = {"layers.{*}"};
  auto fsdp = parallelize(*model, plan, comm);
  fsdp->init_params(3);
  return {std::move(model), std::move(fsdp)};
}

// Two thread ranks take two steps (iterations 4 and 5) at lr with weight_decay over tokens below
// 32; huge_rank (-1: none) first sets embedding row 63 (a token never read, so forward and grads
// stay finite; rank 1 holds rows 32-63) to 1e37. Returns each rank's error ("" when none).
std::vector<std::string> step_errors(double lr, double weight_decay, int huge_rank) {
  std::vector<std::string> errors(2);
  std::mutex mutex;
  testing::run_ranks(2, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto [model, fsdp] = sharded_test_transformer(comm);
    if (comm->rank() == huge_rank)
      for (auto& p : fsdp->units().front()->params)
        if (p.name == "embed.weight") p.shard[31][0].fill_(1e37);
    auto adamw = make_fsdp_adamw(*fsdp, AdamWOptions{0.9, 0.95, 1e-8, weight_decay});
    StateFiniteness finiteness;
    StepSettings settings;
    settings.lr = lr;
    const auto tokens = at::randint(0, 32, {1, 9}, at::make_generator<at::CPUGeneratorImpl>(5 + comm->rank()), at::kLong);
    const auto error = testing::error_of([&] {
      for (int64_t iteration : {4, 5}) {
        settings.iteration = iteration;
        settings.samples = [iteration] { return "stream positions " + std::to_string(2 * iteration - 2) + "-" +
                                                std::to_string(2 * iteration - 1); };
        train_step(*model, *fsdp, *adamw, finiteness, settings, [&](int) { return Batch{{"tokens", tokens}}; });
      }
    });
    std::lock_guard<std::mutex> lock(mutex);
    errors[comm->rank()] = error;
  });
  return errors;
}

TEST(TrainStep, AStepThatOverflowsAWeightStopsEveryRankNamingIt) {
  // The decay multiplies 1e37 by 1 - 10 x 10: past fp32's range; the other rank's weights stay finite.
  const auto errors = step_errors(10.0, 10.0, 1);
  EXPECT_CONTAINS(errors[1], "iteration 4: the AdamW step at lr 10 (grad norm ");
  EXPECT_CONTAINS(errors[1], "made the weights of 'embed.weight' (element 496 of this rank's shard)");
  EXPECT_CONTAINS(errors[1], "of this rank's shard) on rank 1 NaN/Inf, reading stream positions 6-7");
  EXPECT_CONTAINS(errors[1], "stopping before anything is saved (found by the grad-norm reduction of iteration 5");
  EXPECT_CONTAINS(errors[0], "iteration 5: grad norm is nan (NaN/Inf), reading stream positions 8-9");
  EXPECT_CONTAINS(errors[0], "a weight the previous step made NaN/Inf on another rank: see its error");
}

TEST(TrainStep, FiniteStepsPass) {
  const auto errors = step_errors(10.0, 10.0, -1);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace mmtrain

namespace mmtrain {
namespace {

// One step over the same 8 samples (rows of 9 tokens), returning (loss, grad norm) as the trainer
// would record them. world 1: one micro-batch of all 8. world 2: ragged micro-batches, rows
// {0-2}, {3} on rank 0 and {4-5}, {6-7} on rank 1, normalized over the global batch
// (token-budget steps) or, `per_micro_mean`, each micro-batch's own mean / accumulation.
std::pair<double, double> ragged_step(int world, bool per_micro_mean) {
  const auto rows = at::randint(0, 64, {8, 9}, at::make_generator<at::CPUGeneratorImpl>(11), at::kLong);
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> micro_rows =
      world == 1 ? std::vector<std::vector<std::pair<int64_t, int64_t>>>{{{0, 8}}}
                 : std::vector<std::vector<std::pair<int64_t, int64_t>>>{{{0, 3}, {3, 4}}, {{4, 6}, {6, 8}}};
  std::vector<double> loss_sums(world), norms(world);
  testing::run_ranks(world, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto [model, fsdp] = sharded_test_transformer(comm);
    auto adamw = make_fsdp_adamw(*fsdp, AdamWOptions{0.9, 0.95, 1e-8, 0.0});
    StateFiniteness finiteness;
    const auto& mine = micro_rows[static_cast<size_t>(comm->rank())];
    StepSettings settings;
    settings.lr = 1e-3;
    settings.accumulation = static_cast<int>(mine.size());
    if (!per_micro_mean) {
      settings.sum_over_dp = [&](const std::vector<double>& counts) { return comm->all_reduce_sum(counts); };
      settings.dp = world;
    }
    const auto stats = train_step(*model, *fsdp, *adamw, finiteness, settings, [&](int m) {
      const auto [begin, end] = mine[static_cast<size_t>(m)];
      return Batch{{"tokens", rows.slice(0, begin, end)}};
    });
    loss_sums[comm->rank()] = stats.loss_sum;
    norms[comm->rank()] = stats.grad_norm;
  });
  double loss = 0;
  for (double l : loss_sums) loss += l;
  if (per_micro_mean) loss /= 2.0 * world;
  return {loss, norms[0]};
}

// The gradient of a token-budget step is the global batch's whatever the split: ragged
// micro-batches on 2 ranks equal one micro-batch of all on one rank. Averaging each micro-batch's
// own mean instead (the fixed-size convention) weighs the lone row of {3} twice as much as a row of
// {0-2}: a different loss and gradient, which the comparison must catch.
TEST(TrainStep, GlobalNormalizationMakesRaggedMicroBatchesEqualTheWholeBatch) {
  const auto [loss_ref, norm_ref] = ragged_step(1, false);
  const auto [loss, norm] = ragged_step(2, false);
  EXPECT_NEAR(loss, loss_ref, 1e-6 * loss_ref);
  EXPECT_NEAR(norm, norm_ref, 1e-6 * norm_ref);
  const auto [broken_loss, broken_norm] = ragged_step(2, true);
  EXPECT_GT(std::abs(broken_norm - norm_ref), 1e-3 * norm_ref);
  EXPECT_GT(std::abs(broken_loss - loss_ref), 1e-4 * loss_ref);
}

}  // namespace
}  // namespace mmtrain
