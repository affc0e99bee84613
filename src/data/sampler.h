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
// Randomness in collation (noise, sigma) is counter-based too: a collator gets a generator seeded
// from (seed, stream position of its micro-batch's first sample). The step number is therefore
// the whole data state (resuming at step t reproduces the uninterrupted run exactly), and a
// micro-batch draws the same noise whichever rank and accumulation step it lands on (2 ranks x 2
// micro-batches train exactly like 1 rank x 4).
#pragma once
#include <ATen/core/Generator.h>

#include <cstdint>
#include <memory>
#include <mutex>
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
};

class GlobalBatchSampler {
 public:
  GlobalBatchSampler() = default;
  // Fails when a global batch needs more samples than the dataset has (every step would read
  // some sample twice), naming the sizes.
  explicit GlobalBatchSampler(const SamplerOptions& options);

  const SamplerOptions& options() const { return options_; }
  int64_t global_batch_size() const;
  // Whole global batches per epoch: N / G with drop_last; N / G as a fraction without (a step
  // may straddle two epochs), reported here rounded down.
  int64_t steps_per_epoch() const;
  // The epoch (0-based) of step `step`'s first sample.
  int64_t epoch_of_step(int64_t step) const;
  // Stream position of micro-batch `micro`'s first sample in step `step`.
  int64_t first_position(int64_t step, int64_t micro) const;
  // Dataset indices of micro-batch `micro` of step `step`, for this dp rank.
  std::vector<int64_t> indices(int64_t step, int64_t micro) const;
  // The dataset index at a stream position.
  int64_t sample_at(int64_t position) const;

 private:
  SamplerOptions options_;
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

// The generator a collator uses for the micro-batch starting at stream position `position`.
at::Generator collate_generator(uint64_t seed, int64_t position);

}  // namespace mmtrain
