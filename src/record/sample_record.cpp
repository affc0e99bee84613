#include "record/sample_record.h"

namespace mmtrain {

nlohmann::json SampleRecord::to_json() const {
  return {{"kind", kSampleRecordKind}, {"iteration", iteration}, {"dir", dir}, {"samples_s", seconds}};
}

}  // namespace mmtrain
