// Which samples each micro-batch reads, and the generator its collator draws noise from.
//
// The sample stream: epoch e is a permutation of the N dataset indices (the identity without
// shuffle, else a Fisher-Yates shuffle seeded from (seed, e), the same on every rank and for every
// world size); stream position p reads index perm_{p / N}[p % N]. Step t consumes the G =
// micro x accum x dp_world positions starting at
//   t * G                                          without drop_last (a batch may run on into
//                                                  the next epoch: wrap-around)
//   (t / S) * N + (t % S) * G,  S = N / G          with drop_last (the last N mod G samples of
//                                                  each epoch are skipped)
// and micro-batch m of dp rank r is the slice starting (m * dp_world + r) * micro into it.
//
// Token-budget micro-batches (data.dataloader_param.micro_batch_tokens, micro_batch_size 1): the
// step's G positions are the same, but split_step (data/balanced_batches.h) divides them into
// micro-batches of at most that many tokens, balanced over the dp ranks by predicted cost, with
// the same count of micro-batches on every rank (a count that varies from step to step). The
// tokens and cost of each sample come from `sample_load`, asked once per dataset index.
//
// Randomness in collation (noise, sigma) is counter-based too: a collator gets a generator per
// sample, seeded from (seed, stream position of the sample). The step number is therefore the
// whole data state (resuming at step t reproduces the uninterrupted run exactly), and a sample
// draws the same noise whichever micro-batch, rank and accumulation step it lands in (2 ranks x 2
// micro-batches train exactly like 1 rank x 4, and a balanced split like an unbalanced one).
#pragma once
#include "data/balanced_batches.h"

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mmtrain {

struct SamplerOptions {
  int64_t num_samples = 0;
  int64_t micro_batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  int dp_world = 1;
  int dp_rank = 0;
  bool shuffle = false;
  bool drop_last = false;
  uint64_t seed = 0;
  int64_t micro_batch_tokens = 0;  // > 0: token-budget micro-batches (micro_batch_size must be 1)
  bool balance_dp = true;          // token budget: split by predicted cost, not in stream order
  bool skip_over_budget = false;   // token budget: a sample over it is left out, not refused
};

// A dataset index's tokens and predicted cost, for token-budget micro-batches.
using SampleLoadFn = std::function<SampleLoad(int64_t index)>;

class GlobalBatchSampler {
 public:
  GlobalBatchSampler() = default;
  // Fails when a global batch needs more samples than the dataset has (every step would read
  // some sample twice), naming the sizes.
  explicit GlobalBatchSampler(const SamplerOptions& options, SampleLoadFn sample_load = {});

  const SamplerOptions& options() const { return options_; }
  int64_t global_batch_size() const;
  // Whole global batches per epoch: N / G with drop_last; N / G as a fraction without (a step
  // may straddle two epochs), reported here rounded down.
  int64_t steps_per_epoch() const;
  // The epoch (0-based) of step `step`'s first sample.
  int64_t epoch_of_step(int64_t step) const;
  bool token_budget() const { return options_.micro_batch_tokens > 0; }
  // Stream position of step `step`'s first sample (of all ranks).
  int64_t step_begin(int64_t step) const;
  // This rank's micro-batches in step `step`: gradient_accumulation_steps, or under a token
  // budget what the step's split gives (the same on every rank).
  int64_t micro_batches(int64_t step) const;
  // Stream positions of micro-batch `micro` of step `step`, for this dp rank, in stream order.
  std::vector<int64_t> positions(int64_t step, int64_t micro) const;
  // Dataset indices of those positions.
  std::vector<int64_t> indices(int64_t step, int64_t micro) const;
  // Under a token budget, the split of step `step` (positions relative to step_begin); fails
  // otherwise. Computed once per step and kept for the last kSplitsKept steps asked (the loader's
  // workers run ahead of the trainer), so that a step's micro-batches cost one split, not one each.
  StepSplit split(int64_t step) const;
  // How many splits were computed so far (tests: one per step).
  int64_t splits_computed() const;
  // The dataset index at a stream position.
  int64_t sample_at(int64_t position) const;

 private:
  SamplerOptions options_;
  SampleLoadFn sample_load_;
  // Each dataset index's load, asked once (reading a sample's length may read its file).
  struct LoadCache {
    std::mutex mutex;
    std::unordered_map<int64_t, SampleLoad> loads;
  };
  std::shared_ptr<LoadCache> load_cache_ = std::make_shared<LoadCache>();
  SampleLoad load_of(int64_t index) const;
  // The splits of the last steps asked for, newest last.
  static constexpr size_t kSplitsKept = 8;
  struct SplitCache {
    std::mutex mutex;
    std::deque<std::pair<int64_t, std::shared_ptr<const StepSplit>>> splits;
    int64_t computed = 0;
  };
  std::shared_ptr<SplitCache> split_cache_ = std::make_shared<SplitCache>();
  std::shared_ptr<const StepSplit> cached_split(int64_t step) const;
  StepSplit compute_split(int64_t step) const;
  // The permutations of the last epochs asked for (a step touches at most two). Guarded, so
  // that tools may share a sampler across threads.
  struct EpochOrder {
    int64_t epoch = -1;
    std::vector<int64_t> order;
  };
  mutable std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
  mutable EpochOrder cached_[2];
};

// The dataset order of one epoch under shuffle: Fisher-Yates over splitmix64(seed, epoch).
std::vector<int64_t> shuffled_order(int64_t num_samples, uint64_t seed, int64_t epoch);

// The generator a collator uses for the sample at stream position `position`.
at::Generator collate_generator(uint64_t seed, int64_t position);

}  // namespace mmtrain
