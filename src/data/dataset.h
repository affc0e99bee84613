// Datasets and collators, and their registries: samples and how a list of them becomes one
// micro-batch. Which samples (data/sampler.h) and when they are loaded (data/data_loader.h) are
// not theirs to decide.
#pragma once
#include "core/batch.h"
#include "core/registry.h"
#include "data/data_config.h"
#include "models/model_config.h"

#include <ATen/core/Generator.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // One sample as named tensors. Loader workers call it from several threads at once: it must
  // not change shared state.
  virtual Batch get(int64_t index) const = 0;
  // Where sample `index` comes from, for messages about it (a file, a record): "sample <index>"
  // unless the dataset knows better.
  virtual std::string describe(int64_t index) const { return "sample " + std::to_string(index); }
  // What the trainer logs once at start (e.g. records read and dropped); empty for nothing.
  virtual std::string summary() const { return {}; }
  // The tokens sample `index` puts in the model's sequence (image tokens included), read from the
  // sample itself; nullopt when this dataset cannot say. The plan's length mix (plan/length_mix.h).
  virtual std::optional<int64_t> sample_tokens(int64_t index) const { return std::nullopt; }
};

class Collator {
 public:
  virtual ~Collator() = default;
  // Called from loader workers too; all randomness of sample b comes from generators[b] (one per
  // sample: a sample draws the same whichever micro-batch it is collated in).
  virtual Batch collate(const std::vector<Batch>& samples, std::vector<at::Generator>& generators) const = 0;

  // Evaluation at fixed timesteps (a diffusion collator; train/evaluate.h). The timestep at
  // quantile q in (0, 1) of the distribution training draws from (its shift included); nullopt
  // when the collator draws no timestep (a language model's: evaluation is one pass).
  virtual std::optional<double> timestep_quantile(double q) const { return std::nullopt; }
  // collate(), every sample noised at `timestep` instead of a drawn one; its noise still comes
  // from generators[b]. Only called when timestep_quantile gives a value.
  virtual Batch collate_at_timestep(const std::vector<Batch>& samples, std::vector<at::Generator>& generators,
                                    double timestep) const;
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

}  // namespace mmtrain
