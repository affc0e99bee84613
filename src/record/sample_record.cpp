#include "record/sample_record.h"

namespace mmtrain {

nlohmann::json SampleRecord::to_json() const {
  nlohmann::json j = {{"kind", kSampleRecordKind}, {"iteration", iteration}, {"samples_s", seconds}};
  if (error.empty()) {
    j["dir"] = dir;
  } else {
    j["error"] = error;
  }
  if (peak_device_allocated_mb) j["peak_device_allocated_mb"] = *peak_device_allocated_mb;
  return j;
}

}  // namespace mmtrain
