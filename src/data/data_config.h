// DataConfig: the `data` section. Both maps are free-form and passed whole to the dataset and
// collator, which check their own keys; the registry names are read out of them.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct DataConfig {
  std::string dataset_type;                    // data.dataset_param.dataset_type (dataset registry name)
  nlohmann::json dataset_param = nlohmann::json::object();     // the whole dataset_param map
  std::string collate_model_name;              // data.dataloader_param.collate_param.model_name or collator_id
  nlohmann::json dataloader_param = nlohmann::json::object();  // the whole dataloader_param map

  static void declare(ConfigSection<DataConfig>& section);
};

}  // namespace mmtrain
