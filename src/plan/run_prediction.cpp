#include "plan/run_prediction.h"

#include "plan/device_profile.h"
#include "plan/offload_plan.h"
#include "plan/plan_estimate.h"

#include <algorithm>


namespace mmtrain {

RunPrediction predict_run(const Config& config, int world, int devices_per_node, Module& model,
                          const std::vector<int64_t>& seqlens, int64_t first_step_seqlen, double baseline_rss_mb,
                          bool cuda) {
  const int64_t longest = seqlens.empty() ? first_step_seqlen : *std::max_element(seqlens.begin(), seqlens.end());
  const auto estimate = plan_estimate(config, world, longest, model, {}, seqlens);
  const OffloadSetting setting = OffloadSetting::of(config);
  const TierBytes step = offload_tier_bytes(estimate->offload_inputs(), setting);
  const PhaseBytes phases = estimate->phase_bytes(setting, /*device_is_host=*/!cuda);
  const auto around = config_phases(phases, config);
  const int64_t device_peak = largest_phase(around, [](const TierBytes& b) { return b.device; }).bytes;
  const int64_t process_peak = largest_phase(around, [](const TierBytes& b) { return b.device + b.host; }).bytes;
  constexpr double kMB = 1024.0 * 1024.0;  // as peak_rss_mb counts (VmHWM in KiB / 1024)
  RunPrediction p;
  p.seqlen = estimate->seqlen;
  p.seqlen_source = seqlens.empty() ? "the first step's tokens per sample"
                                    : "the longest of " + std::to_string(seqlens.size()) + " samples of the data set";
  if (config.data.loader.micro_batch_tokens > 0)
    p.seqlen_source += "; memory for micro-batches of data.dataloader_param.micro_batch_tokens " +
                       std::to_string(config.data.loader.micro_batch_tokens) + " tokens";
  p.baseline_rss_mb = baseline_rss_mb;
  if (cuda)
    p.peak_device_mb = static_cast<double>(step.device + device_peak) / kMB;
  else
    p.peak_rss_mb = baseline_rss_mb + static_cast<double>(step.device + step.host + process_peak) / kMB;
  if (!config.logging.device_profile.empty()) {
    const DeviceProfile profile = load_device_profile(config.logging.device_profile);
    bool flops = false;
    const StepTimeInputs in = estimate->step_inputs(devices_per_node, &flops);
    if (flops) p.step_time = predict_step_time(in, profile, estimate->plan.config.param_dtype);
    p.device_profile = profile.name;
  }
  return p;
}

nlohmann::ordered_json RunPrediction::to_json() const {
  nlohmann::ordered_json j = {{"seqlen", seqlen}, {"seqlen_source", seqlen_source}, {"baseline_rss_mb", baseline_rss_mb}};
  if (peak_rss_mb) j["predicted_peak_rss_mb"] = *peak_rss_mb;
  if (peak_device_mb) j["predicted_peak_device_mb"] = *peak_device_mb;
  if (step_time) {
    j["device_profile"] = device_profile;
    j["step_time"] = step_time_json(*step_time);
  }
  return j;
}

}  // namespace mmtrain
