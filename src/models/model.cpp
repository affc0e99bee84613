#include "models/model.h"

#include "core/error.h"

namespace mmtrain {

Registry<ModelFactory>& model_registry() {
  static Registry<ModelFactory> registry("model");
  return registry;
}

const at::Tensor& batch_get(const Batch& batch, const std::string& key) {
  auto it = batch.find(key);
  if (it == batch.end()) {
    std::string keys;
    for (const auto& [k, v] : batch) keys += (keys.empty() ? "" : ", ") + k;
    fail("batch has no '", key, "' (it has: ", keys, ")");
  }
  return it->second;
}

}  // namespace mmtrain
