// Where swapped state (AdamW moments under training.optimizer adamw_swap, EMA shadows under
// training.ema.offload) lives between uses: the host tier (offload/host_store.h: pinned host RAM,
// moved through device windows) or the disk tier
// (offload/disk_store.h: a file, moved through RAM windows). optim/swapped_state.h streams
// chunks through either the same way.
//
// A region is reserved once; transfers move whole chunks between a region and a window (a buffer
// the store made, where the update runs) and return a future that is ready when the bytes moved
// and throws what failed.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <future>
#include <string>

namespace mmtrain {

class TierStore {
 public:
  virtual ~TierStore() = default;

  virtual const char* tier() const = 0;  // "host" or "disk": the metrics' key
  // A zeroed fp32 window of numel elements on the side where the update runs.
  virtual at::Tensor window(int64_t numel) = 0;
  // A new region of `bytes` (zeros until written); returns its byte offset.
  virtual int64_t reserve(int64_t bytes) = 0;
  // Queued transfers between the region bytes at `offset` and `chunk` (a leading slice of a
  // window, fp32, contiguous); the chunk must stay alive until the future is ready.
  virtual std::shared_future<void> read(int64_t offset, at::Tensor chunk) = 0;
  virtual std::shared_future<void> write(int64_t offset, const at::Tensor& chunk) = 0;
  // Checkpoint access, never through a device window (a save or load must not bring the state
  // back where the update runs): the numel fp32 elements at offset as a host tensor (the host
  // tier: its bytes themselves, to read only, before the next transfer; the disk: read into a new
  // buffer), and the same elements overwritten from values (any device, numel elements).
  virtual at::Tensor read_to_host(int64_t offset, int64_t numel) = 0;
  virtual void write_from(int64_t offset, const at::Tensor& values) = 0;
  virtual int64_t size() const = 0;          // bytes reserved
  virtual std::string describe() const = 0;  // where the bytes are, for the start-up log
};

}  // namespace mmtrain
