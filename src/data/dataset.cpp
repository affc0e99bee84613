#include "data/dataset.h"

#include "core/error.h"

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

Batch Collator::collate_at_timestep(const std::vector<Batch>&, std::vector<at::Generator>&, double) const {
  fail("this collator draws no timestep: it cannot collate at a fixed one (evaluation asks timestep_quantile first)");
}

}  // namespace mmtrain
