#include "record/step_record.h"

namespace mmtrain {

nlohmann::json StepRecord::to_json() const {
  nlohmann::json j = {{"iteration", iteration},
                      {"consumed_samples", consumed_samples},
                      {"global_batch_size", global_batch_size},
                      {"epoch", epoch},
                      {"loss", loss},
                      {"grad_norm", grad_norm},
                      {"lr", lr},
                      {"step_time_ms", step_time_ms},
                      {"tokens", tokens},
                      {"peak_rss_mb", peak_rss_mb}};
  if (peak_device_allocated_mb) j["peak_device_allocated_mb"] = *peak_device_allocated_mb;
  if (peak_device_reserved_mb) j["peak_device_reserved_mb"] = *peak_device_reserved_mb;
  if (!phases_ms.is_null()) j["phases_ms"] = phases_ms;
  if (!phases_max_ms.is_null()) j["phases_max_ms"] = phases_max_ms;
  j["fsdp_gather_mib"] = fsdp_gather_mib;
  if (dp_work_imbalance) j["dp_work_imbalance"] = *dp_work_imbalance;
  if (dp_compute_imbalance) j["dp_compute_imbalance"] = *dp_compute_imbalance;
  if (dp_work_imbalance_bound) j["dp_work_imbalance_bound"] = *dp_work_imbalance_bound;
  if (micro_batches) j["micro_batches"] = *micro_batches;
  if (budget_fill) j["budget_fill"] = *budget_fill;
  if (samples_skipped) j["samples_skipped"] = *samples_skipped;
  if (tflops_per_device) j["tflops_per_device"] = *tflops_per_device;
  if (mfu) j["mfu"] = *mfu;
  if (checkpoint_stall_ms) j["checkpoint_stall_ms"] = *checkpoint_stall_ms;
  if (!offload.is_null()) j["offload"] = offload;
  if (profiled) j["profiled"] = true;
  if (!memory.is_null()) j["memory"] = memory;
  if (predicted_step_time_ms) j["predicted_step_time_ms"] = *predicted_step_time_ms;
  if (predicted_peak_rss_mb) j["predicted_peak_rss_mb"] = *predicted_peak_rss_mb;
  if (predicted_peak_device_mb) j["predicted_peak_device_mb"] = *predicted_peak_device_mb;
  if (trainable_params) j["trainable_params"] = *trainable_params;
  if (total_params) j["total_params"] = *total_params;
  if (objective.is_object())
    for (const auto& [key, value] : objective.items()) j[key] = value;
  return j;
}

}  // namespace mmtrain
