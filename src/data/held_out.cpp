#include "data/held_out.h"

#include "core/error.h"
#include "core/random.h"
#include "data/sampler.h"

#include <algorithm>
#include <cmath>

namespace mmtrain {

namespace {

// The held-out stream's own seed: never the training order's (shuffled_order(n, seed, epoch)).
constexpr uint64_t kHeldOutSalt = 0x76616c6964617465ULL;  // "validate"

}  // namespace

std::vector<int64_t> held_out_indices(int64_t n, double fraction, uint64_t seed) {
  if (n < 2) fail("data.validation_split: the training set has ", n, " sample(s): nothing can be held out of it");
  if (!(fraction > 0.0 && fraction < 1.0)) fail("data.validation_split must be in (0, 1), found ", fraction);
  const auto count = std::clamp<int64_t>(std::llround(fraction * static_cast<double>(n)), 1, n - 1);
  auto order = shuffled_order(n, splitmix64_mix(seed ^ kHeldOutSalt), 0);
  std::vector<int64_t> held(order.begin(), order.begin() + count);
  std::sort(held.begin(), held.end());
  return held;
}

std::vector<int64_t> remaining_indices(int64_t n, const std::vector<int64_t>& held_out) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n) - held_out.size());
  size_t h = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (h < held_out.size() && held_out[h] == i) {
      ++h;
      continue;
    }
    out.push_back(i);
  }
  return out;
}

SubsetDataset::SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  for (const int64_t i : indices_)
    if (i < 0 || i >= base_->size()) fail("subset of a data set of ", base_->size(), " samples: index ", i, " is outside it");
}

int64_t SubsetDataset::base_index(int64_t index) const {
  if (index < 0 || index >= size()) fail("data set of ", size(), " samples: sample ", index, " asked");
  return indices_[static_cast<size_t>(index)];
}

}  // namespace mmtrain
