// DataConfig: the `data` section. dataset_param is free-form and passed whole to the dataset,
// which checks its own keys (core/param_map.h); dataloader_param is a declared section (the
// sampler and loader options below, each honoured) whose collate_param map goes to the collator.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

// data.dataloader_param: which samples a step reads (data/sampler.h) and how they are loaded
// (data/data_loader.h).
struct LoaderConfig {
  bool shuffle = false;      // a fresh permutation of the dataset every epoch, from (training.seed, epoch)
  bool drop_last = false;    // an epoch ends at its last full global batch; false: batches run on into the next epoch
  int num_workers = 0;       // background threads loading the next micro-batches (0: load on the training thread)
  int prefetch_factor = 2;   // micro-batches loaded ahead per worker
  bool pin_memory = false;   // page-locked host batches for the device copy (CUDA only; nothing to copy on CPU)
  // Token-budget micro-batches (data/sampler.h): > 0 fills each micro-batch up to this many tokens
  // (image tokens included) instead of micro_batch_size samples; MindSpeed-MM's dynamic batching
  // (BucketBatchSampler). Needs training.micro_batch_size 1; the step's samples stay
  // training.global_batch_size.
  int64_t micro_batch_tokens = 0;
  bool balance_dp = true;  // with micro_batch_tokens: even predicted work over the data-parallel ranks
  std::string over_budget_samples = "error";  // with micro_batch_tokens: a sample over it: "error" or "skip"
  std::string sampler_type = "BaseRandomBatchSampler";  // the one sampler (the seed's name for it)
  std::string dataloader_mode = "sampler";              // the one mode
  std::string collator_id;                              // the seed's spelling of collate_param.model_name
  nlohmann::json collate_param = nlohmann::json::object();  // the collator's own map (model_name + its keys)

  static void declare(ConfigSection<LoaderConfig>& section);
};

// dataset_param keys that say how training draws from the data (MagiHuman's flow-matching
// timestep distribution), not what the data is. data.validation inherits them from the training
// section; setting one there to another value is refused by name.
inline const std::vector<std::string> kTrainingDrawKeys = {"sigma_sampling", "logit_normal_loc", "logit_normal_scale"};

struct DataConfig {
  std::string dataset_type;        // data.dataset_param.dataset_type (dataset registry name)
  nlohmann::json dataset_param = nlohmann::json::object();  // the whole dataset_param map
  std::string collate_model_name;  // collate_param.model_name or collator_id (collator registry name)
  LoaderConfig loader;             // data.dataloader_param
  // The held-out set evaluation reads (train/evaluate.h), one of:
  //   validation        a data set section like dataset_param (its own path; dataset_type defaults
  //                     to the training set's); empty: none
  //   validation_split  0 < F < 1: the fraction of the training set held out, chosen from
  //                     training.seed, which training then never reads; 0: none
  nlohmann::json validation = nlohmann::json::object();
  double validation_split = 0.0;

  // data with dataset_type / dataset_param replaced by the validation section's (validation set),
  // except the keys of kTrainingDrawKeys, which come from the training section: a held-out loss
  // is measured at the training distribution's timesteps.
  DataConfig validation_data() const;

  static void declare(ConfigSection<DataConfig>& section);
};

}  // namespace mmtrain
