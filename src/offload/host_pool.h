// The host tier's memory: buffers of page-locked host RAM (cudaHostAlloc when the run computes on
// a GPU, so that device<->host copies run asynchronously at full bandwidth; page-aligned RAM when
// it computes on the CPU) that are reused across steps. A fresh pinned allocation costs milliseconds on CUDA, so a buffer whose
// tensor dies goes back to a free list of its byte size and the next take() of that size gets it.
//
// The memory comes from outside ATen's allocators on purpose: on a CPU build the "device" is the
// host too, and tools.memory_profile counts ATen's CPU allocator as the device, so what lives in
// the pool shows as host-tier bytes (held_bytes()), not as device memory, as it would on a GPU.
//
// A buffer that an asynchronous copy still reads or writes when its tensor dies must not be handed
// out again before that copy is done: the copy stream records each copy's event on its buffer
// (record_use), and take() waits on a reused buffer's last event first. On CPU copies run inline
// and nothing is recorded.
//
// Thread-safe: tensors may die on any thread (autograd's, a copy stream's callback).
#pragma once
#include "offload/copy_event.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace mmtrain {

class HostPool {
 public:
  // pinned: page-locked memory (needs a CUDA build and a GPU); else page-aligned RAM.
  explicit HostPool(bool pinned = false);
  ~HostPool();  // frees the pooled buffers; tensors still alive keep theirs until they die
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A host tensor of `shape` and `dtype`, contents undefined, on a pooled buffer of at least its
  // bytes (rounded up to whole pages). The buffer returns to the pool when the last tensor
  // sharing its storage dies.
  at::Tensor take(at::IntArrayRef shape, at::ScalarType dtype);
  // The same, zero-filled.
  at::Tensor take_zeros(at::IntArrayRef shape, at::ScalarType dtype);

  // `copy` reads or writes t's buffer: the buffer goes to no other take() before it is done.
  // Nothing when t's memory is not one of this pool's buffers.
  void record_use(const at::Tensor& t, CopyEvent copy);

  // Hands the free buffers back to the system (after a phase that held many at once).
  void trim();

  int64_t held_bytes() const;       // buffers handed out now
  int64_t peak_held_bytes() const;  // the most handed out at once since the last reset
  void reset_peak_held_bytes();      // the peak starts again from held_bytes() (a phase's peak)
  int64_t pooled_bytes() const;     // free buffers kept for reuse
  bool pinned() const;              // page-locked

 private:
  struct Shared;  // the free lists; outlives the pool while a tensor holds a buffer
  std::shared_ptr<Shared> shared_;
};

}  // namespace mmtrain
