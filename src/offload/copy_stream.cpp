#include "offload/copy_stream.h"

#ifdef MMTRAIN_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>

namespace mmtrain {

void CopyEvent::wait() {
  if (!impl_) return;
  const auto began = std::chrono::steady_clock::now();
  impl_->synchronize();
  if (impl_->stats)
    impl_->stats->host_wait_us +=
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - began).count();
  impl_.reset();
}

void CopyEvent::wait_on_device() {
  if (impl_) impl_->block_compute_stream();
}

bool CopyEvent::done() const { return !impl_ || impl_->query(); }

namespace {

#ifdef MMTRAIN_CUDA
struct CudaCopyEvent : CopyEvent::Impl {
  at::cuda::CUDAEvent event;
  void synchronize() override { event.synchronize(); }
  bool query() override { return event.query(); }
  // The compute stream waits for the copy; two timing events around the hold give how long it
  // waited, read when the step's waits are settled (OffloadStats::settle_device_waits).
  void block_compute_stream() override {
    const auto compute = c10::cuda::getCurrentCUDAStream();
    if (!stats) return event.block(compute);
    auto before = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    auto after = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    before->record(compute);
    event.block(compute);
    after->record(compute);
    stats->add_unsettled_device_wait([before, after] {
      after->synchronize();
      return static_cast<int64_t>(before->elapsed_time(*after) * 1000.0f);
    });
  }
};
#endif

}  // namespace

struct CopyStream::Side {
#ifdef MMTRAIN_CUDA
  c10::cuda::CUDAStream stream;
#endif
};

CopyStream::CopyStream(at::Device device, std::shared_ptr<OffloadStats> stats, std::shared_ptr<HostPool> host_pool)
    : device_(device), stats_(std::move(stats)), host_pool_(std::move(host_pool)) {
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
  auto impl = std::make_shared<CudaCopyEvent>();
  impl->stats = stats_;
  impl->event.record(side_->stream);
  CopyEvent event(std::move(impl));
  // The host side's pool buffer may not be handed out again before this copy is done.
  if (host_pool_)
    for (const at::Tensor& t : {static_cast<const at::Tensor&>(dst), src})
      if (!t.is_cuda()) host_pool_->record_use(t, event);
  return event;
#else
  return {};
#endif
}

}  // namespace mmtrain
