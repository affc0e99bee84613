// Blocks the host until the work queued on a device is done, so that a timer around GPU work
// measures the work and not its launch. On CPU ops run inline: nothing to wait for. Device-agnostic
// through c10's device guard registry (the CUDA one is registered by a CUDA LibTorch).
#pragma once
#include <c10/core/Device.h>

namespace mmtrain {

void synchronize_device(c10::Device device);

}  // namespace mmtrain
