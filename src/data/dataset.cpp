#include "data/dataset.h"

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

}  // namespace mmtrain
