#include "core/tensor_pool.h"

#include <c10/util/accumulate.h>

namespace mmtrain {

TensorPool::Key TensorPool::key_of(int64_t nbytes, at::ScalarType dtype, at::Device device) {
  return {nbytes, dtype, static_cast<int>(device.type()), device.index()};
}

at::Tensor TensorPool::take(at::IntArrayRef shape, const at::TensorOptions& options) {
  const int64_t nbytes = c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType()));
  auto it = free_.find(key_of(nbytes, options.dtype().toScalarType(), options.device()));
  if (it == free_.end() || it->second.empty()) return at::empty(shape, options);
  auto t = std::move(it->second.back());
  it->second.pop_back();
  return t.view(shape);
}

void TensorPool::give(at::Tensor t) {
  if (!t.defined() || t.numel() == 0) return;
  auto& list = free_[key_of(t.numel() * static_cast<int64_t>(t.element_size()), t.scalar_type(), t.device())];
  if (list.size() < keep_) list.push_back(t.view(-1));
}

}  // namespace mmtrain
