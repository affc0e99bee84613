// Where an objective that makes its own training data gets a step's micro-batches: GRPO's
// rollouts (training.objective grpo; made by src/rl, which registers them here by objective, so
// that the trainer names no generator, as the training samplers are registered from sample/).
// The trainer asks batches_for(step) instead of the loader's micro-batches, and adds what the
// source measured to the step's record.
#pragma once
#include "core/batch.h"
#include "core/registry.h"
#include "data/data_loader.h"
#include "record/sample_record.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <vector>

namespace mmtrain {

struct Run;

class RolloutSource {
 public:
  virtual ~RolloutSource() = default;
  // The micro-batches optimizer step `step` (0-based) trains on, on this rank; made from the
  // loader's micro-batches of data step data_step_of(step) (train/grpo_objective.h). Collective:
  // every rank calls it for every step.
  virtual const std::vector<Batch>& batches_for(Run& run, DataLoader& loader, int64_t step) = 0;
  // Its metrics for the step's record (over all ranks), added to StepRecord::objective.
  virtual nlohmann::json step_metrics() const = 0;
  // What the step's new rollout shows as TensorBoard texts (metrics.jsonl's samples record); null
  // when it made none or shows none.
  virtual std::unique_ptr<SampleRecord> take_texts() = 0;
};

// By training.objective; an objective with no entry trains on the loader's micro-batches.
using RolloutSourceFactory = std::function<std::unique_ptr<RolloutSource>(const Run& run)>;
Registry<RolloutSourceFactory>& rollout_source_registry();

}  // namespace mmtrain
