// The GPU's own measure of a step's memory: the CUDA caching allocator's peak of allocated bytes
// (tensors alive) and of reserved bytes (what it holds from the driver, fragmentation included),
// since the last reset. What metrics.jsonl reports as peak_device_allocated_mb /
// peak_device_reserved_mb and checks against the plan's predicted_peak_device_mb. A CPU run (or a
// build without CUDA) has no such measure: nullopt.
#pragma once
#include <ATen/ATen.h>

#include <optional>

namespace mmtrain {

struct DeviceMemoryPeak {
  double allocated_mb = 0;
  double reserved_mb = 0;
};

// Starts a new peak on `device` (the step's start).
void reset_device_memory_peak(at::Device device);
// The peaks since the last reset; nullopt off CUDA.
std::optional<DeviceMemoryPeak> device_memory_peak(at::Device device);

}  // namespace mmtrain
