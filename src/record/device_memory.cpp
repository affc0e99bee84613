#include "record/device_memory.h"

#ifdef MMTRAIN_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace mmtrain {

void reset_device_memory_peak(at::Device device) {
#ifdef MMTRAIN_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
#endif
}

std::optional<DeviceMemoryPeak> device_memory_peak(at::Device device) {
#ifdef MMTRAIN_CUDA
  if (!device.is_cuda()) return std::nullopt;
  using c10::CachingAllocator::StatType;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  const auto aggregate = static_cast<size_t>(StatType::AGGREGATE);
  constexpr double kMB = 1024.0 * 1024.0;
  return DeviceMemoryPeak{static_cast<double>(stats.allocated_bytes[aggregate].peak) / kMB,
                          static_cast<double>(stats.reserved_bytes[aggregate].peak) / kMB};
#else
  (void)device;
  return std::nullopt;
#endif
}

}  // namespace mmtrain
