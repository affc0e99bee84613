// The device the tests in tests/device/ run on: MMTRAIN_DEVICE (cpu by default; scripts/gpu_check.sh
// sets cuda). In ctest they run on the CPU, which keeps their logic tested between GPU runs.
#pragma once
#include "dist/runtime.h"

#include <ATen/ATen.h>

namespace mmtrain::testing {

inline at::Device run_device() {
  return default_device() == Device::cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

}  // namespace mmtrain::testing
