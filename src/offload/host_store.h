// The host tier for swapped state: each region is a buffer of the host pool (pinned under CUDA),
// and transfers are CopyStream copies between it and a device window, so on a GPU the next chunk
// comes in while the current one updates. On CPU the window is ordinary (device-allocator) memory
// and a copy is a memcpy: the same code path, with the region's bytes counted as the host tier's.
#pragma once
#include "offload/copy_stream.h"
#include "offload/host_pool.h"
#include "offload/tier_store.h"

#include <map>
#include <memory>

namespace mmtrain {

class HostStore : public TierStore {
 public:
  HostStore(std::shared_ptr<HostPool> pool, std::shared_ptr<CopyStream> copies);

  const char* tier() const override { return "host"; }
  at::Tensor window(int64_t numel) override;  // on the copy stream's device
  int64_t reserve(int64_t bytes) override;
  std::shared_future<void> read(int64_t offset, at::Tensor chunk) override;
  std::shared_future<void> write(int64_t offset, const at::Tensor& chunk) override;
  at::Tensor read_to_host(int64_t offset, int64_t numel) override;
  void write_from(int64_t offset, const at::Tensor& values) override;
  int64_t size() const override { return end_; }
  std::string describe() const override;

 private:
  // numel fp32 elements of a region from `offset` on.
  at::Tensor region_slice(int64_t offset, int64_t numel) const;

  std::shared_ptr<HostPool> pool_;
  std::shared_ptr<CopyStream> copies_;
  std::map<int64_t, at::Tensor> regions_;  // start offset -> fp32 host buffer
  int64_t end_ = 0;
};

}  // namespace mmtrain
