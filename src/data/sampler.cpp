#include "data/sampler.h"

#include "core/error.h"
#include "core/random.h"

#include <ATen/CPUGeneratorImpl.h>

#include <numeric>

namespace mmtrain {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
// Keeps the shuffle's stream apart from the collators' (both start from training.seed).
constexpr uint64_t kShuffleStream = 0x53485546464C4531ULL;  // "SHUFFLE1"

// A uniform integer in [0, bound) from the splitmix64 stream at *state (Lemire's method with
// rejection, so no index is favoured).
uint64_t uniform_below(uint64_t bound, uint64_t* state) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  while (true) {
    *state += kGolden;
    const unsigned __int128 product = static_cast<unsigned __int128>(splitmix64_mix(*state)) * bound;
    if (static_cast<uint64_t>(product) >= threshold) return static_cast<uint64_t>(product >> 64);
  }
}

}  // namespace

std::vector<int64_t> shuffled_order(int64_t num_samples, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(num_samples));
  std::iota(order.begin(), order.end(), int64_t{0});
  uint64_t state = splitmix64_mix(seed ^ kShuffleStream) + kGolden * static_cast<uint64_t>(epoch + 1);
  for (int64_t i = num_samples - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform_below(static_cast<uint64_t>(i) + 1, &state));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

GlobalBatchSampler::GlobalBatchSampler(const SamplerOptions& options, SampleLoadFn sample_load)
    : options_(options), sample_load_(std::move(sample_load)) {
  const auto& o = options_;
  if (o.micro_batch_tokens > 0 && (o.micro_batch_size != 1 || !sample_load_))
    fail("sampler: token-budget micro-batches need micro_batch_size 1 and each sample's load");
  if (o.num_samples < 1) fail("sampler: the dataset has no samples");
  if (o.micro_batch_size < 1 || o.gradient_accumulation_steps < 1 || o.dp_world < 1 || o.dp_rank < 0 ||
      o.dp_rank >= o.dp_world)
    fail("sampler: invalid batch layout (micro ", o.micro_batch_size, ", accumulation ", o.gradient_accumulation_steps,
         ", dp rank ", o.dp_rank, " of ", o.dp_world, ")");
  if (global_batch_size() > o.num_samples)
    fail("the global batch (training.micro_batch_size ", o.micro_batch_size, " x gradient_accumulation_steps ",
         o.gradient_accumulation_steps, " x ", o.dp_world, " data-parallel ranks = ", global_batch_size(),
         " samples) is larger than the dataset (", o.num_samples,
         " samples): every step would read some samples twice; lower the batch or add data");
}

int64_t GlobalBatchSampler::global_batch_size() const {
  return options_.micro_batch_size * options_.gradient_accumulation_steps * options_.dp_world;
}

int64_t GlobalBatchSampler::steps_per_epoch() const { return options_.num_samples / global_batch_size(); }

int64_t GlobalBatchSampler::epoch_of_step(int64_t step) const {
  if (options_.drop_last) return step / steps_per_epoch();
  return step * global_batch_size() / options_.num_samples;
}

int64_t GlobalBatchSampler::step_begin(int64_t step) const {
  if (!options_.drop_last) return step * global_batch_size();
  const int64_t per_epoch = steps_per_epoch();
  return step / per_epoch * options_.num_samples + step % per_epoch * global_batch_size();
}

int64_t GlobalBatchSampler::micro_batches(int64_t step) const {
  return token_budget() ? cached_split(step)->micro_batches_per_rank() : options_.gradient_accumulation_steps;
}

std::vector<int64_t> GlobalBatchSampler::positions(int64_t step, int64_t micro) const {
  const int64_t begin = step_begin(step);
  std::vector<int64_t> out;
  if (token_budget()) {
    const auto step_split = cached_split(step);
    const auto& mine = step_split->micro_batches.at(static_cast<size_t>(options_.dp_rank));
    if (micro < 0 || micro >= static_cast<int64_t>(mine.size()))
      fail("sampler: step ", step, " has ", mine.size(), " micro-batches per rank, asked for ", micro);
    for (int64_t p : mine[static_cast<size_t>(micro)]) out.push_back(begin + p);
    return out;
  }
  const int64_t first = begin + (micro * options_.dp_world + options_.dp_rank) * options_.micro_batch_size;
  for (int64_t i = 0; i < options_.micro_batch_size; ++i) out.push_back(first + i);
  return out;
}

SampleLoad GlobalBatchSampler::load_of(int64_t index) const {
  {
    std::lock_guard<std::mutex> lock(load_cache_->mutex);
    if (auto found = load_cache_->loads.find(index); found != load_cache_->loads.end()) return found->second;
  }
  const SampleLoad load = sample_load_(index);  // outside the lock: it may read a file
  std::lock_guard<std::mutex> lock(load_cache_->mutex);
  return load_cache_->loads.emplace(index, load).first->second;
}

StepSplit GlobalBatchSampler::split(int64_t step) const { return *cached_split(step); }

int64_t GlobalBatchSampler::splits_computed() const {
  std::lock_guard<std::mutex> lock(split_cache_->mutex);
  return split_cache_->computed;
}

std::shared_ptr<const StepSplit> GlobalBatchSampler::cached_split(int64_t step) const {
  if (!token_budget()) fail("sampler: split() asked without a token budget");
  auto& cache = *split_cache_;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    for (const auto& [cached_step, split] : cache.splits)
      if (cached_step == step) return split;
  }
  // Outside the lock: it may read the samples' files. Two threads asking for the same new step
  // both compute it (the same pure function), and one copy is kept.
  auto split = std::make_shared<const StepSplit>(compute_split(step));
  std::lock_guard<std::mutex> lock(cache.mutex);
  ++cache.computed;
  for (const auto& [cached_step, kept] : cache.splits)
    if (cached_step == step) return kept;
  cache.splits.emplace_back(step, split);
  if (cache.splits.size() > kSplitsKept) cache.splits.pop_front();
  return split;
}

StepSplit GlobalBatchSampler::compute_split(int64_t step) const {
  const int64_t begin = step_begin(step);
  std::vector<SampleLoad> loads;
  for (int64_t i = 0; i < global_batch_size(); ++i) loads.push_back(load_of(sample_at(begin + i)));
  // A refused sample is named by its dataset index, stream position and iteration.
  auto describe = [&](int64_t p) {
    return "dataset sample " + std::to_string(sample_at(begin + p)) + " (stream position " + std::to_string(begin + p) +
           ", iteration " + std::to_string(step + 1) + ")";
  };
  const std::string step_name = "iteration " + std::to_string(step + 1) + " (stream positions " +
                                std::to_string(begin) + "-" + std::to_string(begin + global_batch_size() - 1) + ")";
  return split_step(loads, options_.dp_world, options_.micro_batch_tokens, options_.balance_dp,
                    options_.skip_over_budget, describe, step_name);
}

int64_t GlobalBatchSampler::sample_at(int64_t position) const {
  const int64_t n = options_.num_samples;
  if (!options_.shuffle) return position % n;
  const int64_t epoch = position / n;
  std::lock_guard<std::mutex> lock(*mutex_);
  auto& slot = cached_[epoch % 2];
  if (slot.epoch != epoch) slot = {epoch, shuffled_order(n, options_.seed, epoch)};
  return slot.order[static_cast<size_t>(position % n)];
}

std::vector<int64_t> GlobalBatchSampler::indices(int64_t step, int64_t micro) const {
  std::vector<int64_t> out;
  for (int64_t position : positions(step, micro)) out.push_back(sample_at(position));
  return out;
}

at::Generator collate_generator(uint64_t seed, int64_t position) {
  return at::make_generator<at::CPUGeneratorImpl>(splitmix64_mix(seed ^ ((static_cast<uint64_t>(position) + 1) * kGolden)));
}

}  // namespace mmtrain
