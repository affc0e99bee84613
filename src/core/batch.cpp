#include "core/batch.h"

#include "core/error.h"

namespace mmtrain {

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
