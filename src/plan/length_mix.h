// The sequence lengths a run's data set actually holds, for the plan (issue 37: the data set's own
// length mix, read from its samples, not assumed): up to `max_samples` samples spread evenly over
// the data set (first and last included), each asked for its tokens (Dataset::sample_tokens). The
// plan sizes memory by the longest and times the step by all of them (the FLOPs of each).
#pragma once
#include "config/config.h"
#include "data/dataset.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

struct LengthMix {
  std::vector<int64_t> seqlens;  // of the samples read, in data set order; empty when none
  int64_t dataset_size = 0;
  std::string unavailable;       // why there is none: the data set does not build, or cannot say
  int64_t longest() const;
  double median() const;         // core/statistics.h's median
};

// From the config's data set, built for the purpose.
LengthMix read_length_mix(const Config& config, int64_t max_samples = 64);
// From a data set already built (the trainer's).
LengthMix read_length_mix(const Dataset& dataset, int64_t max_samples);

}  // namespace mmtrain
