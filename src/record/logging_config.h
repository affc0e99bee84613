// The `logging` section: where a run writes its records (metrics.jsonl, TensorBoard) and what they
// measure against (the device's peak FLOP/s for MFU, a device profile for the predicted step time).
#pragma once
#include <string>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct LoggingConfig {
  std::string output_dir = "runs/default";     // metrics.jsonl and logs go here
  bool progress = true;                        // an ETA on the console when stdout is a terminal
  double hardware_flops = 0.0;                 // peak FLOP/s of one device, for MFU; 0 = not reported
  bool tensorboard = false;                    // also write each record to <output_dir>/tensorboard/ (rank 0)
  // A device profile (h200, h100, a100, 910b3, or a JSON from `measure profile`): each record then
  // carries the step time the plan predicts on it (docs/step_time.md); "" = memory only.
  std::string device_profile;

  static void declare(ConfigSection<LoggingConfig>& section);
};

}  // namespace mmtrain
