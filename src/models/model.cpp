#include "models/model.h"

#include "core/error.h"

#include <ATen/ATen.h>

namespace mmtrain {

std::optional<double> loss_normalizer(const Batch& batch, size_t term) {
  const auto found = batch.find(kLossNormalizerKey);
  if (found == batch.end()) return std::nullopt;
  const auto& normalizers = found->second;
  if (normalizers.dim() != 1 || static_cast<size_t>(normalizers.size(0)) <= term)
    fail("batch '", kLossNormalizerKey, "' must hold a count per loss term (term ", term, " asked), found ",
         normalizers.sizes());
  return normalizers[static_cast<int64_t>(term)].item<double>();
}

}  // namespace mmtrain
