// data.validation_split: a held-out slice of the training set. Which samples are held out is a
// function of (dataset size, fraction, training.seed) alone, the same on any world size; the
// training sampler then reads a SubsetDataset of the others and never reaches a held-out sample.
#pragma once
#include "data/dataset.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace mmtrain {

// round(fraction x n) indices (at least 1, at most n - 1), sorted: the first of a permutation of
// [0, n) drawn from seed (not the training order's: a different stream).
std::vector<int64_t> held_out_indices(int64_t n, double fraction, uint64_t seed);
// [0, n) without `held_out` (sorted), in order.
std::vector<int64_t> remaining_indices(int64_t n, const std::vector<int64_t>& held_out);

// The samples of `base` at `indices`, renumbered 0..size-1; messages still name the base's samples.
class SubsetDataset : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Batch get(int64_t index) const override { return base_->get(base_index(index)); }
  std::string describe(int64_t index) const override { return base_->describe(base_index(index)); }
  std::string summary() const override { return base_->summary(); }
  std::optional<int64_t> sample_tokens(int64_t index) const override { return base_->sample_tokens(base_index(index)); }
  // The base's index of sample `index`.
  int64_t base_index(int64_t index) const;
  const std::shared_ptr<const Dataset>& base() const { return base_; }

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
};

}  // namespace mmtrain
