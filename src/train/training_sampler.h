// Samples during training (training.sample_interval, sample_prompts, sample_at_start; docs/sampling.md):
// after every sample_interval steps (and before the first with sample_at_start) the model's own
// sampler writes what the model makes from the fixed prompts and seeds into
// <output_dir>/samples/iter_N/. Samplers register by model_id from src/sample, which knows the
// models; the trainer knows none. A sampler reads no training data, draws only from its own
// generators and runs forward-only FSDP passes as evaluation does, so the training that follows is
// bitwise the one without it.
#pragma once
#include "core/registry.h"
#include "record/sample_record.h"

#include <functional>
#include <memory>
#include <string>

namespace mmtrain {

struct Run;

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

}  // namespace mmtrain
