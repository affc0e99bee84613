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
  struct Buffer {
    void* p = nullptr;
    CopyEvent last_copy;  // the last copy recorded on it (complete when none)
  };
  bool pinned = false;
  mutable std::mutex mutex;
  std::map<int64_t, std::vector<Buffer>> free;  // bytes -> buffers
  std::map<void*, CopyEvent> in_use;            // handed-out buffers -> their last recorded copy
  int64_t held = 0, peak = 0, pooled = 0;

  ~Shared() { trim(); }

  void* take(int64_t bytes) {
    Buffer buffer;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto& list = free[bytes];
      if (!list.empty()) {
        buffer = std::move(list.back());
        list.pop_back();
        pooled -= bytes;
      }
    }
    if (!buffer.p) buffer.p = allocate_host(bytes, pinned);
    buffer.last_copy.wait();  // a copy still reading or writing it finishes before anyone reuses it
    std::lock_guard<std::mutex> lock(mutex);
    held += bytes;
    peak = std::max(peak, held);
    in_use[buffer.p] = CopyEvent();
    return buffer.p;
  }

  void give(void* p, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = in_use.find(p);
    free[bytes].push_back({p, std::move(it->second)});
    in_use.erase(it);
    held -= bytes;
    pooled += bytes;
  }

  void record_use(void* p, CopyEvent copy) {
    std::lock_guard<std::mutex> lock(mutex);
    // Copies on the side stream finish in order: the newest one's event covers the earlier ones.
    if (auto it = in_use.find(p); it != in_use.end()) it->second = std::move(copy);
  }

  void trim() {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [bytes, list] : free)
      for (auto& buffer : list) {
        buffer.last_copy.wait();
        free_host(buffer.p, pinned);
      }
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

void HostPool::record_use(const at::Tensor& t, CopyEvent copy) {
  if (!t.defined() || !t.has_storage()) return;
  shared_->record_use(t.storage().data_ptr().get(), std::move(copy));
}

int64_t HostPool::held_bytes() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->held;
}

int64_t HostPool::peak_held_bytes() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->peak;
}

void HostPool::reset_peak_held_bytes() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->peak = shared_->held;
}

int64_t HostPool::pooled_bytes() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->pooled;
}

bool HostPool::pinned() const { return shared_->pinned; }

}  // namespace mmtrain
