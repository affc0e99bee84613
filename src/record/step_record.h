// StepRecord: what one optimizer step reports, the one declaration of metrics.jsonl's keys. The
// trainer fills it, MetricsLog writes it (a JSON line and the Megatron-style console line), and
// the key names here are the ones `mmtrain logs`, `plots`, `ablate` and the benches read.
// docs/tools.md#what-each-step-records-metricsjsonl explains each key.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>

namespace mmtrain {

struct StepRecord {
  int64_t iteration = 0;                    // 1-based: the step just taken
  int64_t consumed_samples = 0;             // iteration x global_batch_size
  int64_t global_batch_size = 0;
  int64_t epoch = 0;                        // of the step's first sample, 0-based
  double loss = 0;                          // mean over ranks and micro-batches
  double grad_norm = 0;                     // before clipping
  double lr = 0;
  double step_time_ms = 0;
  int64_t tokens = 0;                       // over all ranks
  double peak_rss_mb = 0;                   // max over ranks
  // On CUDA: the caching allocator's peaks of the step, max over ranks (record/device_memory.h).
  std::optional<double> peak_device_allocated_mb, peak_device_reserved_mb;
  nlohmann::json phases_ms;                 // phase -> ms on rank 0 (data, forward, ..., comm_wait)
  double fsdp_gather_mib = 0;               // what rank 0's FSDP all-gathers received in the step
  nlohmann::json phases_max_ms;             // the same, max over ranks
  // Balance over ranks, max / mean: of the model's FLOPs for each rank's micro-batches (when the
  // model counts them), and of the measured compute (forward + backward less comm_wait); and the
  // best any assignment of the step's micro-batches to ranks could reach, max(mean, heaviest
  // micro-batch) / mean.
  // Under a token budget the bound is of the step's samples, max(mean, heaviest sample) / mean.
  std::optional<double> dp_work_imbalance, dp_compute_imbalance, dp_work_imbalance_bound;
  // Token-budget steps (data.dataloader_param.micro_batch_tokens): micro-batches per rank, the
  // step's tokens over (all ranks' micro-batches x the budget), and the samples left out for being
  // over the budget (over_budget_samples: skip).
  std::optional<int64_t> micro_batches;
  std::optional<double> budget_fill;
  std::optional<int64_t> samples_skipped;
  std::optional<double> tflops_per_device;  // when the model counts FLOPs
  std::optional<double> mfu;                // a fraction, when logging.hardware_flops is set
  // Save iterations only: the ms the save held training up after the step (a synchronous save:
  // all of it; training.async_save: waiting for the previous save, if any, and the staging copy).
  std::optional<double> checkpoint_stall_ms;
  // training.offload_dir: what the step moved per tier on rank 0, {"disk": {"read_mib",
  // "written_mib", "wait_ms"}} (wait_ms: the time the optimizer waited for the disk); null otherwise.
  nlohmann::json offload;
  bool profiled = false;                    // the step ran under the Kineto profiler
  nlohmann::json memory;                    // per-phase peaks of a memory-profiled step; null otherwise
  // The plan's prediction for this run (plan/run_prediction.h): the step time with
  // logging.device_profile, the peak RSS (CPU) or device memory (CUDA) always.
  std::optional<double> predicted_step_time_ms, predicted_peak_rss_mb, predicted_peak_device_mb;
  // The run's first record: the elements that train (all of them, or LoRA's adapters and
  // modules_to_save) and the model's total.
  std::optional<int64_t> trainable_params, total_params;
  // A preference objective's metrics under TRL's names ("rewards/chosen", "logps/rejected", ...:
  // train/objective.h), means over the step's pairs; written as keys of the record itself.
  nlohmann::json objective;

  nlohmann::json to_json() const;
};

}  // namespace mmtrain
