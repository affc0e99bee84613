#include "record/sample_record.h"

namespace mmtrain {

nlohmann::json SampleRecord::to_json() const {
  nlohmann::json j = {{"kind", kSampleRecordKind}, {"iteration", iteration}, {"dir", dir}, {"samples_s", seconds}};
  if (peak_device_allocated_mb) j["peak_device_allocated_mb"] = *peak_device_allocated_mb;
  return j;
}

}  // namespace mmtrain
