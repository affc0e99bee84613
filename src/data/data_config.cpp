#include "data/data_config.h"

#include "core/config_schema.h"
#include "core/error.h"

namespace mmtrain {
namespace {

// The registry names, out of the free-form maps (after every override, so that
// `--set data.dataset_param.dataset_type=x` is seen).
void derive_names(DataConfig& d, const ConfigCheck& check) {
  auto optional_string = [&](const nlohmann::json& map, const std::string& key, const std::string& path) {
    if (!map.contains(key) || map[key].is_null()) return std::string();
    if (!map[key].is_string()) fail(check.where(path), ": expected a string, found ", map[key].dump());
    return map[key].get<std::string>();
  };
  d.dataset_type = optional_string(d.dataset_param, "dataset_type", "dataset_param.dataset_type");
  d.collate_model_name.clear();
  const auto& loader = d.dataloader_param;
  if (loader.contains("collate_param") && !loader["collate_param"].is_null()) {
    if (!loader["collate_param"].is_object())
      fail(check.where("dataloader_param.collate_param"), ": expected a map, found ", loader["collate_param"].dump());
    d.collate_model_name = optional_string(loader["collate_param"], "model_name", "dataloader_param.collate_param.model_name");
  }
  // The seed's spelling (MindSpeed-MM FSDP configs): dataloader_param.collator_id.
  const auto collator_id = optional_string(loader, "collator_id", "dataloader_param.collator_id");
  if (!collator_id.empty()) {
    if (!d.collate_model_name.empty() && d.collate_model_name != collator_id)
      fail(check.where("dataloader_param.collator_id"), ": '", collator_id, "' disagrees with ",
           check.path("dataloader_param.collate_param.model_name"), " '", d.collate_model_name, "': give one");
    d.collate_model_name = collator_id;
  }
}

}  // namespace

void DataConfig::declare(ConfigSection<DataConfig>& s) {
  s.field("dataset_param", &DataConfig::dataset_param)
      .field("dataloader_param", &DataConfig::dataloader_param)
      .derive(derive_names);
}

}  // namespace mmtrain
