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

// Two thread ranks take two steps (iterations 4 and 5) at lr with weight_decay over tokens below
// 32; huge_rank (-1: none) first sets embedding row 63 (a token never read, so forward and grads
// stay finite; rank 1 holds rows 32-63) to 1e37. Returns each rank's error ("" when none).
std::vector<std::string> step_errors(double lr, double weight_decay, int huge_rank) {
  std::vector<std::string> errors(2);
  std::mutex mutex;
  testing::run_ranks(2, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto model = make_test_transformer(kModelConfig);
    ParallelizePlan plan;
    plan.fsdp.apply_modules = {"layers.{*}"};
    auto fsdp = parallelize(*model, plan, comm);
    fsdp->init_params(3);
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
