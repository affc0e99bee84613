#include "data/dataset.h"

#include <ATen/CPUGeneratorImpl.h>

namespace mmtrain {

Registry<DatasetFactory>& dataset_registry() {
  static Registry<DatasetFactory> registry("dataset");
  return registry;
}

Registry<CollatorFactory>& collator_registry() {
  static Registry<CollatorFactory> registry("collator");
  return registry;
}

DatasetRegistration::DatasetRegistration(const std::string& name, DatasetFactory factory) {
  dataset_registry().add(name, std::move(factory));
}

CollatorRegistration::CollatorRegistration(const std::string& name, CollatorFactory factory) {
  collator_registry().add(name, std::move(factory));
}

int64_t GlobalBatchSampler::first_position(int64_t step, int64_t micro) const {
  return step * global_batch_size() + (micro * dp_world + dp_rank) * micro_batch_size;
}

std::vector<int64_t> GlobalBatchSampler::indices(int64_t step, int64_t micro) const {
  std::vector<int64_t> out;
  const int64_t begin = first_position(step, micro);
  for (int64_t i = 0; i < micro_batch_size; ++i) out.push_back((begin + i) % num_samples);
  return out;
}

at::Generator collate_generator(uint64_t seed, int64_t position) {
  // splitmix64-style mixing so nearby positions give unrelated streams.
  uint64_t z = seed ^ ((static_cast<uint64_t>(position) + 1) * 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return at::make_generator<at::CPUGeneratorImpl>(z ^ (z >> 31));
}

}  // namespace mmtrain
