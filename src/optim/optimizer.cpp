#include "optim/optimizer.h"

#include "core/finite.h"

namespace mmtrain {

void Optimizer::check_paged(size_t i, int64_t begin, const at::Tensor& updated) {
  if (paged_non_finite_ || !after_update_) return;
  if (const int64_t at = first_non_finite(updated); at >= 0) paged_non_finite_ = NonFiniteWeight{i, begin + at};
}

}  // namespace mmtrain
