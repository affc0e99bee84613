// The global-batch sampler: which dataset index every (step, micro-batch, rank) reads under
// shuffle and drop_last, checked against the stream definition written out by hand, across world
// sizes, and from a fresh sampler (resume).
#include "data/sampler.h"
#include "test_util.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

namespace mmtrain {
namespace {

using mmtrain::testing::error_of;

SamplerOptions options(int64_t n, int64_t micro, int64_t accum, int world, bool shuffle, bool drop_last) {
  SamplerOptions o;
  o.num_samples = n;
  o.micro_batch_size = micro;
  o.gradient_accumulation_steps = accum;
  o.dp_world = world;
  o.shuffle = shuffle;
  o.drop_last = drop_last;
  o.seed = 7;
  return o;
}

// What step `step` reads over all ranks, in global-batch order (micro-batch m of rank r is block
// m * world + r).
std::vector<int64_t> global_batch(SamplerOptions o, int64_t step) {
  std::vector<std::vector<int64_t>> blocks(static_cast<size_t>(o.gradient_accumulation_steps * o.dp_world));
  for (int r = 0; r < o.dp_world; ++r) {
    o.dp_rank = r;
    const GlobalBatchSampler sampler(o);
    for (int64_t m = 0; m < o.gradient_accumulation_steps; ++m)
      blocks[static_cast<size_t>(m * o.dp_world + r)] = sampler.indices(step, m);
  }
  std::vector<int64_t> out;
  for (const auto& b : blocks) out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST(ShuffledOrder, IsAPermutationFixedBySeedAndEpoch) {
  const auto a = shuffled_order(1000, 7, 0);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity);
  EXPECT_EQ(a, shuffled_order(1000, 7, 0));
  EXPECT_NE(a, shuffled_order(1000, 7, 1));
  EXPECT_NE(a, shuffled_order(1000, 8, 0));
  // Every index lands in the first slot about equally often (a biased shuffle would not).
  std::vector<int> first(10, 0);
  for (int64_t epoch = 0; epoch < 5000; ++epoch) ++first[static_cast<size_t>(shuffled_order(10, 1, epoch)[0])];
  for (int count : first) EXPECT_NEAR(count, 500, 90);
}

TEST(GlobalBatchSampler, InOrderWrapsAcrossEpochs) {
  // 10 samples, global batch 4: step 2 reads positions 8, 9 of epoch 0 and 0, 1 of epoch 1.
  const auto o = options(10, 2, 1, 2, false, false);
  EXPECT_EQ(global_batch(o, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(global_batch(o, 2), (std::vector<int64_t>{8, 9, 0, 1}));
  const GlobalBatchSampler sampler(o);
  EXPECT_EQ(sampler.epoch_of_step(2), 0);
  EXPECT_EQ(sampler.epoch_of_step(3), 1);
}

TEST(GlobalBatchSampler, ShuffleReadsEachEpochsPermutation) {
  const auto o = options(10, 2, 1, 2, true, false);
  const auto epoch0 = shuffled_order(10, 7, 0), epoch1 = shuffled_order(10, 7, 1);
  EXPECT_EQ(global_batch(o, 0), (std::vector<int64_t>{epoch0[0], epoch0[1], epoch0[2], epoch0[3]}));
  EXPECT_EQ(global_batch(o, 2), (std::vector<int64_t>{epoch0[8], epoch0[9], epoch1[0], epoch1[1]}));
}

TEST(GlobalBatchSampler, DropLastSkipsTheTailOfEveryEpoch) {
  // 10 samples, global batch 4: 2 steps per epoch, positions 8 and 9 of each epoch unread.
  const auto o = options(10, 1, 2, 2, true, true);
  const GlobalBatchSampler sampler(o);
  EXPECT_EQ(sampler.steps_per_epoch(), 2);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto order = shuffled_order(10, 7, epoch);
    auto read = global_batch(o, 2 * epoch);
    const auto second = global_batch(o, 2 * epoch + 1);
    read.insert(read.end(), second.begin(), second.end());
    EXPECT_EQ(read, std::vector<int64_t>(order.begin(), order.begin() + 8)) << "epoch " << epoch;
    EXPECT_EQ(sampler.epoch_of_step(2 * epoch + 1), epoch);
  }
  // Noise positions stay unique: epoch 1 starts at stream position 10, not 8.
  EXPECT_EQ(sampler.step_begin(2), 10);
  EXPECT_EQ(sampler.positions(2, 0).front(), 10);
}

TEST(GlobalBatchSampler, SameStreamForEveryWorldSizeAndResume) {
  for (bool drop_last : {false, true}) {
    const auto one_rank = options(37, 2, 4, 1, true, drop_last);
    for (auto [world, accum] : {std::pair{2, 2}, std::pair{4, 1}}) {
      const auto o = options(37, 2, accum, world, true, drop_last);
      for (int64_t step = 0; step < 12; ++step)
        EXPECT_EQ(global_batch(o, step), global_batch(one_rank, step)) << "world " << world << " step " << step;
    }
    // Resume: a fresh sampler asked for step 9 first reads what the running one read at step 9.
    const GlobalBatchSampler running(one_rank);
    std::vector<int64_t> seen;
    for (int64_t step = 0; step <= 9; ++step) seen = running.indices(step, 3);
    EXPECT_EQ(GlobalBatchSampler(one_rank).indices(9, 3), seen);
  }
}

TEST(GlobalBatchSampler, RefusesAGlobalBatchLargerThanTheDataset) {
  const auto message = error_of([] { GlobalBatchSampler(options(5, 2, 2, 2, false, false)); });
  EXPECT_CONTAINS(message, "global batch");
  EXPECT_CONTAINS(message, "= 8 samples) is larger than the dataset (5 samples)");
}

}  // namespace
}  // namespace mmtrain

namespace mmtrain {
namespace {

// Token budget: sample i has 50 + (i * 37) % 400 tokens, cost tokens^2.
SampleLoad ragged_load(int64_t index) {
  const int64_t tokens = 50 + (index * 37) % 400;
  return {tokens, static_cast<double>(tokens) * static_cast<double>(tokens)};
}

// The sorted stream positions step `step` reads over all ranks, each rank checked to have the
// same number of micro-batches.
std::vector<int64_t> budget_step_positions(SamplerOptions o, int64_t step) {
  std::vector<int64_t> out;
  int64_t micro_batches = -1;
  for (int r = 0; r < o.dp_world; ++r) {
    o.dp_rank = r;
    const GlobalBatchSampler sampler(o, ragged_load);
    if (micro_batches < 0) micro_batches = sampler.micro_batches(step);
    EXPECT_EQ(sampler.micro_batches(step), micro_batches) << "rank " << r;
    for (int64_t m = 0; m < micro_batches; ++m) {
      const auto positions = sampler.positions(step, m);
      EXPECT_FALSE(positions.empty());
      int64_t tokens = 0;
      for (int64_t p : positions) tokens += ragged_load(sampler.sample_at(p)).tokens;
      EXPECT_LE(tokens, o.micro_batch_tokens);
      out.insert(out.end(), positions.begin(), positions.end());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GlobalBatchSampler, TokenBudgetReadsEachStepsGlobalBatchOnceOnAnyWorld) {
  for (bool balance : {true, false}) {
    auto o = options(101, 1, 0, 1, /*shuffle=*/true, /*drop_last=*/false);
    o.micro_batch_tokens = 600;
    o.balance_dp = balance;
    for (int64_t step = 0; step < 9; ++step) {
      std::vector<int64_t> expected(16);
      std::iota(expected.begin(), expected.end(), step * 16);
      // The same 16 stream positions (the fixed-size run's global batch) on 2 and 4 ranks.
      for (auto [world, accum] : {std::pair{2, 8}, std::pair{4, 4}}) {
        o.dp_world = world;
        o.gradient_accumulation_steps = accum;
        EXPECT_EQ(budget_step_positions(o, step), expected) << "world " << world << " step " << step;
      }
    }
  }
}

TEST(GlobalBatchSampler, TokenBudgetAsksEachSampleItsLoadOnce) {
  auto o = options(40, 1, 4, 2, true, false);
  o.micro_batch_tokens = 600;
  auto asked = std::make_shared<std::map<int64_t, int>>();
  const GlobalBatchSampler sampler(o, [asked](int64_t index) {
    ++(*asked)[index];
    return ragged_load(index);
  });
  for (int64_t step = 0; step < 5; ++step)
    for (int64_t m = 0; m < sampler.micro_batches(step); ++m) sampler.positions(step, m);
  EXPECT_EQ(asked->size(), 40u);  // 5 steps x 8 samples: every index once
  for (const auto& [index, count] : *asked) EXPECT_EQ(count, 1) << "index " << index;
}

TEST(GlobalBatchSampler, TokenBudgetRefusesAnOverBudgetSampleNamingIt) {
  auto o = options(40, 1, 4, 2, false, false);
  o.micro_batch_tokens = 300;  // sample 7 has 50 + 259 = 309 tokens
  const GlobalBatchSampler sampler(o, ragged_load);
  EXPECT_CONTAINS(error_of([&] { sampler.micro_batches(0); }),
                  "dataset sample 7 (stream position 7, iteration 1) has 309 tokens, over the budget of 300");
  o.skip_over_budget = true;
  const GlobalBatchSampler skipping(o, ragged_load);
  EXPECT_EQ(skipping.split(0).skipped, (std::vector<int64_t>{7}));
}

// Issue 47's performance defect: a step's micro-batches each recomputed the step's split, O(G)
// splits of O(G) samples per step (22.5 s of data per step at G = 4096). Now one per step, however
// many micro-batches, positions() and split() calls ask for it.
TEST(GlobalBatchSampler, TokenBudgetComputesEachStepsSplitOnce) {
  auto o = options(4096, 1, 0, 1, /*shuffle=*/true, /*drop_last=*/false);
  o.gradient_accumulation_steps = 1024;  // G = 1024 on one rank
  o.micro_batch_tokens = 1;              // a budget of 1: every sample its own micro-batch
  const GlobalBatchSampler sampler(o, [](int64_t) { return SampleLoad{1, 1.0}; });
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_EQ(sampler.micro_batches(step), 1024);
    for (int64_t m = 0; m < sampler.micro_batches(step); ++m) sampler.positions(step, m);
    sampler.split(step);
    EXPECT_EQ(sampler.splits_computed(), step + 1) << "step " << step;
  }
}

TEST(GlobalBatchSampler, TokenBudgetNamesTheIterationOfAStepThatCannotSplit) {
  auto o = options(40, 1, 4, 2, false, false);
  o.micro_batch_tokens = 10;  // every ragged sample is over it
  o.skip_over_budget = true;
  const GlobalBatchSampler sampler(o, ragged_load);
  EXPECT_CONTAINS(error_of([&] { sampler.micro_batches(1); }),
                  "micro_batch_tokens: iteration 2 (stream positions 8-15): its 0 samples (after skipping 8 over the "
                  "budget) cannot give each of 2 data-parallel rank(s) a micro-batch");
}

}  // namespace
}  // namespace mmtrain
