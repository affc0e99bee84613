#include "core/device_sync.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace mmtrain {

void synchronize_device(c10::Device device) {
  if (device.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
}

}  // namespace mmtrain
