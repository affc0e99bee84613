// The end of one asynchronous copy between the device and the host tier (offload/copy_stream.h
// makes them). Under MMTRAIN_CUDA it is a CUDA event recorded on the side stream; on CPU the copy
// ran inline and the event is empty (complete). Tests stand in a late copy through Impl.
#pragma once
#include "offload/offload_stats.h"

#include <memory>

namespace mmtrain {

class CopyEvent {
 public:
  // What one copy's completion is: a CUDA event on the side stream, or a test's stand-in.
  struct Impl {
    virtual ~Impl() = default;
    virtual void synchronize() = 0;              // blocks the host until the copy is done
    virtual bool query() = 0;                    // done, without blocking
    virtual void block_compute_stream() {}       // the device's current stream waits for it
    std::shared_ptr<OffloadStats> stats;         // where host waits are counted (may be null)
  };

  // Default-constructed: already complete.
  CopyEvent() = default;
  explicit CopyEvent(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  // Blocks the host until the copy is done (the host is about to read or reuse the bytes), and
  // counts the time blocked in stats' host_wait_us.
  void wait();
  // Makes the device's current stream wait for the copy (the device is about to read the bytes);
  // the host goes on. On CPU: nothing to wait for.
  void wait_on_device();
  bool done() const;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace mmtrain
