// Datasets, collators and the sampler: how samples become micro-batches.
//
// Randomness in collation (noise, sigma) is counter-based: a collator gets a generator seeded
// from (seed, position in the sample stream of its micro-batch's first sample). The data
// position is therefore the whole data state (resuming at step t reproduces the uninterrupted
// run exactly), and a micro-batch draws the same noise whichever rank and accumulation step it
// lands on (2 ranks x 2 micro-batches train exactly like 1 rank x 4).
#pragma once
#include "core/batch.h"
#include "core/registry.h"
#include "data/data_config.h"
#include "models/model_config.h"

#include <ATen/core/Generator.h>

#include <memory>
#include <string>
#include <vector>

namespace mmtrain {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Batch get(int64_t index) const = 0;  // one sample as named tensors
  // What the trainer logs once at start (e.g. records read and dropped); empty for nothing.
  virtual std::string summary() const { return {}; }
};

class Collator {
 public:
  virtual ~Collator() = default;
  virtual Batch collate(const std::vector<Batch>& samples, at::Generator& generator) const = 0;
};

// Factories see the data section and the model section: a dataset may take shapes from
// model.config, a tokenizer path from model.model_name_or_path.
using DatasetFactory = std::function<std::shared_ptr<Dataset>(const DataConfig& data, const ModelConfig& model)>;
using CollatorFactory = std::function<std::shared_ptr<Collator>(const DataConfig& data, const ModelConfig& model)>;

// By data.dataset_param.dataset_type and data.dataloader_param.collate_param.model_name.
Registry<DatasetFactory>& dataset_registry();
Registry<CollatorFactory>& collator_registry();

// Register at static initialisation, from the dataset's own folder:
//   static const DatasetRegistration dataset("token_file", make_token_file_dataset);
struct DatasetRegistration {
  DatasetRegistration(const std::string& name, DatasetFactory factory);
};
struct CollatorRegistration {
  CollatorRegistration(const std::string& name, CollatorFactory factory);
};

// Which samples each micro-batch reads. Step t consumes the global batch of samples
// [t * G, (t + 1) * G) modulo the dataset size, G = micro * accum * dp_world; micro-batch m of
// dp rank r is the slice starting at t * G + (m * dp_world + r) * micro.
struct GlobalBatchSampler {
  int64_t num_samples = 0;
  int64_t micro_batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  int dp_world = 1;
  int dp_rank = 0;

  int64_t global_batch_size() const { return micro_batch_size * gradient_accumulation_steps * dp_world; }
  // Position in the sample stream (before the modulo) of micro-batch `micro`'s first sample.
  int64_t first_position(int64_t step, int64_t micro) const;
  std::vector<int64_t> indices(int64_t step, int64_t micro) const;
};

// The generator a collator uses for the micro-batch starting at stream position `position`.
at::Generator collate_generator(uint64_t seed, int64_t position);

}  // namespace mmtrain
