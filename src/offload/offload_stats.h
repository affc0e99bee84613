// What the offload tiers moved and how long training waited for them, per process, for
// metrics.jsonl ("offload": {"host": {...}, "disk": {...}}) and tests. Counters only grow; a step's
// figures are the difference of two snapshots. Updated from the I/O thread and the training
// thread, hence atomics (wait times in microseconds). The disk tier's bytes are counted by its
// DiskStore (bytes_read / bytes_written), which fills them into a snapshot.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace mmtrain {

struct OffloadCounts {
  int64_t to_host_bytes = 0;       // device -> host tier
  int64_t to_device_bytes = 0;     // host tier -> device
  int64_t host_wait_us = 0;        // time the step blocked on device<->host copies
  int64_t device_wait_us = 0;      // time a GPU's compute stream waited for them (CUDA only)
  int64_t disk_read_bytes = 0;     // disk tier -> RAM
  int64_t disk_written_bytes = 0;  // RAM -> disk tier
  int64_t disk_wait_us = 0;        // time the step blocked on the disk

  OffloadCounts operator-(const OffloadCounts& before) const {
    return {to_host_bytes - before.to_host_bytes,     to_device_bytes - before.to_device_bytes,
            host_wait_us - before.host_wait_us,       device_wait_us - before.device_wait_us,
            disk_read_bytes - before.disk_read_bytes, disk_written_bytes - before.disk_written_bytes,
            disk_wait_us - before.disk_wait_us};
  }
};

struct OffloadStats {
  std::atomic<int64_t> to_host_bytes{0}, to_device_bytes{0}, host_wait_us{0}, device_wait_us{0}, disk_wait_us{0};

  // A wait whose length is known only once the device has run past it (a GPU stream held until a
  // copy is done, timed by two events around the hold): `measure_us` is called when the waits are
  // settled, at the step's end, and may block until the device got there.
  void add_unsettled_device_wait(std::function<int64_t()> measure_us) {
    std::lock_guard<std::mutex> lock(unsettled_mutex_);
    unsettled_.push_back(std::move(measure_us));
  }
  // Measures the unsettled waits into device_wait_us.
  void settle_device_waits() {
    std::vector<std::function<int64_t()>> waits;
    {
      std::lock_guard<std::mutex> lock(unsettled_mutex_);
      waits.swap(unsettled_);
    }
    for (auto& measure : waits) device_wait_us += measure();
  }

  OffloadCounts snapshot() const {
    OffloadCounts counts;
    counts.to_host_bytes = to_host_bytes.load();
    counts.to_device_bytes = to_device_bytes.load();
    counts.host_wait_us = host_wait_us.load();
    counts.device_wait_us = device_wait_us.load();
    counts.disk_wait_us = disk_wait_us.load();
    return counts;
  }

 private:
  std::mutex unsettled_mutex_;
  std::vector<std::function<int64_t()>> unsettled_;
};

}  // namespace mmtrain
