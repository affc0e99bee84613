// A free list of tensors by size, for buffers a hot loop needs again and again (FSDP's reduce
// buffers, Gloo's receive buffers): a fresh allocation of tens of MB costs page faults every
// time, since glibc hands such sizes back to the kernel when they are freed.
//   take(shape, options) returns a tensor of that shape: a pooled buffer of the same byte size,
//   dtype and device when there is one (contents undefined), else a fresh at::empty.
//   give(t) returns t's storage to the pool; the caller must hold no other reference to it.
// At most `keep` buffers of one size stay pooled; more go back to the allocator.
// Not thread-safe: one owner thread takes and gives.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <tuple>
#include <vector>

namespace mmtrain {

class TensorPool {
 public:
  explicit TensorPool(size_t keep) : keep_(keep) {}

  at::Tensor take(at::IntArrayRef shape, const at::TensorOptions& options);
  void give(at::Tensor t);
  // Hands every pooled buffer back to the allocator.
  void clear() { free_.clear(); }

 private:
  using Key = std::tuple<int64_t, at::ScalarType, int, int>;  // (nbytes, dtype, device type, device index)
  static Key key_of(int64_t nbytes, at::ScalarType dtype, at::Device device);
  size_t keep_;
  std::map<Key, std::vector<at::Tensor>> free_;
};

}  // namespace mmtrain
