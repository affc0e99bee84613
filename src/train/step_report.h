// The step and record phases of a run. run_step takes one optimizer step (its micro-batches from
// the loader, train_step, the profilers around it) and keeps what this rank measured;
// report_step turns that into the step's StepRecord (record/step_record.h): the reductions over
// ranks (loss, tokens, FLOPs, phase times, memory peaks), the balance over data-parallel ranks,
// throughput and MFU, the offload tiers' traffic, and the plan's prediction for the run
// (plan/run_prediction.h) held against the measured peak.
#pragma once
#include "data/balanced_batches.h"
#include "data/data_loader.h"
#include "offload/offload_stats.h"
#include "plan/run_prediction.h"
#include "record/step_record.h"
#include "train/run.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace mmtrain {

// What one step measured on this rank, before any reduction.
struct StepOutcome {
  int64_t step = 0;   // 0-based: the step taken is iteration step + 1
  int64_t epoch = 0;  // of the step's first sample
  std::chrono::steady_clock::time_point started;
  std::optional<StepSplit> split;  // token-budget steps: the step's micro-batches
  int accumulation = 1;            // micro-batches on this rank
  double lr = 0;
  StepStats stats;
  std::vector<double> phases_ms;   // indexed by StepPhase, then comm_wait
  int64_t gathered_bytes = 0;      // received by this rank's FSDP all-gathers
  bool memory_profiled = false;    // tools.memory_profile covered this step
  bool traced = false;             // tools.profile traced it
  OffloadCounts offload_before;    // the tiers' counters as the step began
  nlohmann::json rollout;          // GRPO: the rollout's metrics (rl/rollout.h); else null
};

// The step phase: step `step` (0-based), its micro-batches read from `loader`.
StepOutcome run_step(Run& run, DataLoader& loader, int64_t step);

// The plan's prediction for this run, made once by rank 0 at the first step for the longest of
// kPredictionSamples samples spread over the data set (or, when it cannot say, the first step's
// tokens per sample); written to <output_dir>/plan.json and said once when the measured peak
// exceeds it by more than the margin.
class PlanWatch {
 public:
  void check(const Run& run, StepRecord& record);

 private:
  static constexpr int64_t kPredictionSamples = 256;
  bool asked_ = false;  // the prediction is made once; it may be unavailable (said as a warning)
  std::optional<RunPrediction> prediction_;
  bool peak_over_prediction_said_ = false;
};

// The record phase: the step's StepRecord, reduced over ranks (collective: every rank calls it)
// and checked against the plan.
StepRecord report_step(Run& run, const StepOutcome& outcome, PlanWatch& plan_watch);

}  // namespace mmtrain
