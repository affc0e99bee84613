#include "offload/copy_stream.h"

#ifdef MMTRAIN_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>

namespace mmtrain {

struct CopyEvent::Impl {
  std::shared_ptr<OffloadStats> stats;
#ifdef MMTRAIN_CUDA
  at::cuda::CUDAEvent event;
#endif
};

void CopyEvent::wait() {
  if (!impl_) return;
#ifdef MMTRAIN_CUDA
  const auto began = std::chrono::steady_clock::now();
  impl_->event.synchronize();
  impl_->stats->host_wait_us += std::chrono::duration_cast<std::chrono::microseconds>(
                                    std::chrono::steady_clock::now() - began).count();
#endif
  impl_.reset();
}

void CopyEvent::wait_on_device() {
  if (!impl_) return;
#ifdef MMTRAIN_CUDA
  impl_->event.block(c10::cuda::getCurrentCUDAStream());
#endif
}

bool CopyEvent::done() const {
#ifdef MMTRAIN_CUDA
  return !impl_ || impl_->event.query();
#else
  return true;
#endif
}

struct CopyStream::Side {
#ifdef MMTRAIN_CUDA
  c10::cuda::CUDAStream stream;
#endif
};

CopyStream::CopyStream(at::Device device, std::shared_ptr<OffloadStats> stats)
    : device_(device), stats_(std::move(stats)) {
#ifdef MMTRAIN_CUDA
  if (device_.is_cuda()) side_.reset(new Side{c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index())});
#endif
}

CopyStream::~CopyStream() = default;

CopyEvent CopyStream::to_host(at::Tensor dst, const at::Tensor& src) {
  stats_->to_host_bytes += src.numel() * static_cast<int64_t>(src.element_size());
  return copy(dst, src);
}

CopyEvent CopyStream::to_device(at::Tensor dst, const at::Tensor& src) {
  stats_->to_device_bytes += src.numel() * static_cast<int64_t>(src.element_size());
  return copy(dst, src);
}

CopyEvent CopyStream::copy(at::Tensor& dst, const at::Tensor& src) {
  at::NoGradGuard no_grad;
  if (!side_) {
    dst.copy_(src);
    return {};
  }
#ifdef MMTRAIN_CUDA
  c10::cuda::CUDAGuard device_guard(device_);
  // The side stream starts once what the compute stream has queued (src's producer) is done.
  at::cuda::CUDAEvent queued;
  queued.record(c10::cuda::getCurrentCUDAStream(device_.index()));
  queued.block(side_->stream);
  {
    c10::cuda::CUDAStreamGuard on_side(side_->stream);
    dst.copy_(src, /*non_blocking=*/true);
  }
  for (const at::Tensor& t : {static_cast<const at::Tensor&>(dst), src})
    if (t.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), side_->stream);
  auto impl = std::make_shared<CopyEvent::Impl>();
  impl->stats = stats_;
  impl->event.record(side_->stream);
  return CopyEvent(std::move(impl));
#else
  return {};
#endif
}

}  // namespace mmtrain
