// The run checks the plan: what `mmtrain plan` predicts for this run's own configuration, world
// and tokens, computed once (at the first step) by the same
// rules (plan/plan_estimate.h, plan/step_time.h, plan/offload_plan.h), carried in every metrics
// record and written whole to <output_dir>/plan.json for `logs summary` and `plan --calibrate`:
//   predicted_step_time_ms   the step-time model on logging.device_profile (absent without one)
//   predicted_peak_rss_mb    on CPU: the process's RSS before the model was built (the runtime,
//                            the data pipeline) plus the plan's device and host bytes for the step
//                            and the largest phase around it (start-up, the configured save, a
//                            resume): what peak_rss_mb measures
//   predicted_peak_device_mb on CUDA: the plan's device bytes for the step and that phase
// A measured peak above the prediction by more than kPredictionMargin of it and kPredictionFloorMb
// (allocators and threads hold tens of MB the plan does not count, which on a tiny model is more
// than 10 %) is said once in the log.
#pragma once
#include "config/config.h"
#include "models/model.h"
#include "plan/step_time.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

constexpr double kPredictionMargin = 0.10;
constexpr double kPredictionFloorMb = 64.0;

// Whether a measured peak is above its prediction by more than the margin and the floor.
inline bool peak_over_prediction(double measured_mb, double predicted_mb) {
  return measured_mb - predicted_mb > std::max(kPredictionMargin * predicted_mb, kPredictionFloorMb);
}

struct RunPrediction {
  int64_t seqlen = 0;                  // tokens per sample the memory is predicted for
  std::string seqlen_source;           // where that length comes from
  double baseline_rss_mb = 0;
  std::optional<double> peak_rss_mb, peak_device_mb;
  std::optional<StepTime> step_time;   // with a device profile
  std::string device_profile;          // its name
  nlohmann::ordered_json to_json() const;  // plan.json
};

// model: the run's model (its parameters' full shapes). devices_per_node: ranks per node.
// seqlens: the data set's sample lengths (plan/length_mix.h): the longest sizes the memory, all of
// them time the step; empty: first_step_seqlen, the first step's tokens per sample, for both.
RunPrediction predict_run(const Config& config, int world, int devices_per_node, Module& model,
                          const std::vector<int64_t>& seqlens, int64_t first_step_seqlen, double baseline_rss_mb,
                          bool cuda);

}  // namespace mmtrain
