// Asynchronous copies between the device and the host tier, each returning a completion event.
// Under MMTRAIN_CUDA a copy runs on a side CUDA stream, after the work already queued on the
// device's current stream (so it reads finished values), with the device tensors marked as used
// by that stream (the caching allocator keeps them until it is done); from pinned host memory
// (offload/host_pool.h) such copies overlap compute. On CPU the device is the host and a copy runs
// inline: the event is complete when copy() returns. One interface, so the features above it
// (activation offload, adamw_swap, fsdp cpu_offload) have one code path.
#pragma once
#include "offload/copy_event.h"
#include "offload/host_pool.h"
#include "offload/offload_stats.h"

#include <ATen/ATen.h>

#include <memory>

namespace mmtrain {

class CopyStream {
 public:
  // device: where the compute runs (kCPU: copies run inline). stats: where bytes and waits are
  // counted. host_pool (optional): the pool whose buffers the host side of copies come from; each
  // copy's event is recorded on its buffer, so that the buffer is not handed out again before the
  // copy is done (HostPool::record_use).
  CopyStream(at::Device device, std::shared_ptr<OffloadStats> stats, std::shared_ptr<HostPool> host_pool = nullptr);
  ~CopyStream();

  // dst.copy_(src) (same shape, any dtypes), one side on the device and the other on the host
  // (or both on the host on CPU). Counted as device -> host when dst is the host tier (to_host),
  // else host -> device.
  CopyEvent to_host(at::Tensor dst, const at::Tensor& src);
  CopyEvent to_device(at::Tensor dst, const at::Tensor& src);

  at::Device device() const { return device_; }
  OffloadStats& stats() { return *stats_; }

 private:
  CopyEvent copy(at::Tensor& dst, const at::Tensor& src);

  at::Device device_;
  std::shared_ptr<OffloadStats> stats_;
  std::shared_ptr<HostPool> host_pool_;
  struct Side;  // the CUDA side stream (CUDA builds)
  std::unique_ptr<Side> side_;
};

}  // namespace mmtrain
