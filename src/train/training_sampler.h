// Samples during training (training.sample_interval, sample_prompts, sample_at_start; docs/sampling.md):
// after every sample_interval steps (and before the first with sample_at_start) the model's own
// sampler writes what the model makes from the fixed prompts and seeds into
// <output_dir>/samples/iter_N/. Samplers register by model_id from src/sample, which knows the
// models; the trainer knows none. A sampler reads no training data, draws only from its own
// generators and runs forward-only FSDP passes as evaluation does, so the training that follows is
// bitwise the one without it.
//
// Sampling is a side task: it runs after the iteration's save, builds samples/.iter_N.partial and
// renames it to iter_N when whole (a killed run leaves no iter_N that looks done; a resume samples
// its first iteration again when that is missing), and a failure is logged and recorded in
// metrics.jsonl ({"kind": "samples", "error": ...}) while training goes on, or, with
// training.sample_failure: stop, ends the run after a save of that iteration. What can be checked
// before the first step is (the prompts, the decoders' directories, <output_dir>/samples).
#pragma once
#include "core/registry.h"
#include "record/sample_record.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace mmtrain {

struct Run;
class MetricsLog;

class TrainingSampler {
 public:
  virtual ~TrainingSampler() = default;
  // Every rank calls it (FSDP's gathers are collective); out_dir exists. Returns what TensorBoard
  // shows of the samples (rank 0's is the one recorded); the caller fills iteration, dir and time.
  virtual SampleRecord sample(Run& run, const std::string& out_dir) = 0;
};

// Reads and checks training.sample_prompts when the run is built, so a bad prompt fails at once.
using TrainingSamplerFactory = std::function<std::unique_ptr<TrainingSampler>(Run& run)>;
Registry<TrainingSamplerFactory>& training_sampler_registry();

// The sampling phase of a run (none when the config does not sample).
class SamplingPhase {
 public:
  // Builds the model's sampler and checks <output_dir>/samples (absent or a directory, not a link).
  // Collective.
  explicit SamplingPhase(Run& run);
  // Whether the config samples after `iteration` (0: sample_at_start).
  bool due(int64_t iteration) const;
  // Samples after `iteration` when due and not already done; false when it failed (logged and
  // recorded). Collective.
  bool run_if_due(Run& run, MetricsLog& metrics, int64_t iteration);

 private:
  std::unique_ptr<TrainingSampler> sampler_;
  int64_t interval_ = 0;
  bool at_start_ = false;
};

}  // namespace mmtrain
