#include "offload/host_pool.h"

#include "core/error.h"

#ifdef MMTRAIN_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstdlib>

namespace mmtrain {
namespace {

constexpr int64_t kPage = 4096;

int64_t whole_pages(int64_t bytes) { return std::max<int64_t>(kPage, (bytes + kPage - 1) / kPage * kPage); }

void* allocate_host(int64_t bytes, bool pinned) {
  void* p = nullptr;
  if (pinned) {
#ifdef MMTRAIN_CUDA
    if (const cudaError_t e = cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault); e != cudaSuccess)
      fail("host tier: cudaHostAlloc of ", bytes, " bytes of pinned memory failed: ", cudaGetErrorString(e));
    return p;
#else
    fail("host tier: pinned memory needs a CUDA build (-DMMTRAIN_CUDA=ON)");
#endif
  }
  p = std::aligned_alloc(kPage, static_cast<size_t>(bytes));
  if (!p) fail("host tier: cannot allocate ", bytes, " bytes of host memory");
  return p;
}

void free_host(void* p, bool pinned) {
#ifdef MMTRAIN_CUDA
  if (pinned) {
    cudaFreeHost(p);
    return;
  }
#endif
  std::free(p);
}

}  // namespace

struct HostPool::Shared {
  bool pinned = false;
  mutable std::mutex mutex;
  std::map<int64_t, std::vector<void*>> free;  // bytes -> buffers
  int64_t held = 0, peak = 0, pooled = 0;

  ~Shared() { trim(); }

  void* take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    void* p = nullptr;
    auto& list = free[bytes];
    if (list.empty()) {
      p = allocate_host(bytes, pinned);
    } else {
      p = list.back();
      list.pop_back();
      pooled -= bytes;
    }
    held += bytes;
    peak = std::max(peak, held);
    return p;
  }

  void give(void* p, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    free[bytes].push_back(p);
    held -= bytes;
    pooled += bytes;
  }

  void trim() {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [bytes, list] : free)
      for (void* p : list) free_host(p, pinned);
    free.clear();
    pooled = 0;
  }
};

HostPool::HostPool(bool pinned) : shared_(std::make_shared<Shared>()) { shared_->pinned = pinned; }

HostPool::~HostPool() { shared_->trim(); }

void HostPool::trim() { shared_->trim(); }

at::Tensor HostPool::take(at::IntArrayRef shape, at::ScalarType dtype) {
  const int64_t bytes = whole_pages(c10::multiply_integers(shape) * static_cast<int64_t>(at::elementSize(dtype)));
  void* p = shared_->take(bytes);
  auto shared = shared_;
  return at::from_blob(
      p, shape, [shared, bytes](void* data) { shared->give(data, bytes); }, at::TensorOptions().dtype(dtype));
}

at::Tensor HostPool::take_zeros(at::IntArrayRef shape, at::ScalarType dtype) { return take(shape, dtype).zero_(); }

int64_t HostPool::held_bytes() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->held;
}

int64_t HostPool::peak_held_bytes() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->peak;
}

int64_t HostPool::pooled_bytes() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->pooled;
}

bool HostPool::pinned() const { return shared_->pinned; }

}  // namespace mmtrain
