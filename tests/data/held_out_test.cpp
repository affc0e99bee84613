// data.validation_split (data/held_out.h): which samples are held out is fixed by (size, fraction,
// seed), and a training sampler over the rest never reads one of them in a full epoch on 2 ranks.
#include "data/held_out.h"
#include "data/sampler.h"
#include "test_util.h"

#include <algorithm>
#include <set>

namespace mmtrain {
namespace {

using mmtrain::testing::error_of;

// Sample i is {"index": i}.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Batch get(int64_t index) const override { return {{"index", at::scalar_tensor(index, at::kLong)}}; }

 private:
  int64_t n_;
};

TEST(HeldOut, IsFixedBySizeFractionAndSeed) {
  const auto held = held_out_indices(100, 0.25, 7);
  EXPECT_EQ(held.size(), 25u);
  EXPECT_TRUE(std::is_sorted(held.begin(), held.end()));
  EXPECT_EQ(held, held_out_indices(100, 0.25, 7));
  EXPECT_NE(held, held_out_indices(100, 0.25, 8));
  const auto rest = remaining_indices(100, held);
  EXPECT_EQ(rest.size(), 75u);
  std::set<int64_t> all(held.begin(), held.end());
  all.insert(rest.begin(), rest.end());
  EXPECT_EQ(all.size(), 100u);
  EXPECT_EQ(held_out_indices(10, 0.01, 1).size(), 1u);  // at least one
  EXPECT_EQ(held_out_indices(10, 0.99, 1).size(), 9u);  // at most n - 1
  EXPECT_CONTAINS(error_of([] { held_out_indices(1, 0.5, 1); }), "nothing can be held out");
}

TEST(HeldOut, TrainingNeverReadsAHeldOutSampleInAFullEpochOnTwoRanks) {
  auto base = std::make_shared<CountingDataset>(40);
  const auto held = held_out_indices(40, 0.25, 5);
  const std::set<int64_t> held_set(held.begin(), held.end());
  const SubsetDataset training(base, remaining_indices(40, held));
  SamplerOptions o;
  o.num_samples = training.size();
  o.micro_batch_size = 3;  // global batch 6: five whole steps per epoch of 30
  o.gradient_accumulation_steps = 1;
  o.dp_world = 2;
  o.shuffle = true;
  o.seed = 5;
  std::set<int64_t> read;
  for (int rank = 0; rank < 2; ++rank) {
    o.dp_rank = rank;
    const GlobalBatchSampler sampler(o);
    for (int64_t step = 0; step < sampler.steps_per_epoch(); ++step)
      for (const int64_t index : sampler.indices(step, 0)) {
        const int64_t sample = training.get(index).at("index").item<int64_t>();
        EXPECT_EQ(held_set.count(sample), 0u) << "held-out sample " << sample << " read at step " << step;
        read.insert(sample);
      }
  }
  EXPECT_EQ(read.size(), 30u);  // every training sample once in the epoch
}

}  // namespace
}  // namespace mmtrain
