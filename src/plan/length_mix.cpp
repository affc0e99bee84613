#include "plan/length_mix.h"

#include "config/registries.h"
#include "core/error.h"
#include "core/statistics.h"

#include <algorithm>

namespace mmtrain {

int64_t LengthMix::longest() const { return seqlens.empty() ? 0 : *std::max_element(seqlens.begin(), seqlens.end()); }

double LengthMix::median() const {
  return seqlens.empty() ? 0.0 : mmtrain::median(std::vector<double>(seqlens.begin(), seqlens.end()));
}

LengthMix read_length_mix(const Config& config, int64_t max_samples) {
  LengthMix mix;
  std::shared_ptr<Dataset> dataset;
  try {
    dataset = build_dataset(config);
  } catch (const Error& e) {
    mix.unavailable = std::string("the data set does not load: ") + e.what();
    return mix;
  }
  mix = read_length_mix(*dataset, max_samples);
  if (!mix.unavailable.empty()) mix.unavailable = "data set '" + config.data.dataset_type + "': " + mix.unavailable;
  return mix;
}

LengthMix read_length_mix(const Dataset& dataset, int64_t max_samples) {
  LengthMix mix;
  mix.dataset_size = dataset.size();
  if (mix.dataset_size == 0) {
    mix.unavailable = "the data set is empty";
    return mix;
  }
  const int64_t count = std::min(max_samples, mix.dataset_size);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t index = count == 1 ? 0 : i * (mix.dataset_size - 1) / (count - 1);
    const auto tokens = dataset.sample_tokens(index);
    if (!tokens) {
      mix.seqlens.clear();
      mix.unavailable = "it cannot say a sample's tokens";
      return mix;
    }
    mix.seqlens.push_back(*tokens);
  }
  return mix;
}

}  // namespace mmtrain
