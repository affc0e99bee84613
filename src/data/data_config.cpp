#include "data/data_config.h"

#include "core/checked_math.h"
#include "core/config_schema.h"
#include "core/error.h"

namespace mmtrain {
namespace {

std::string optional_string(const nlohmann::json& map, const std::string& key, const std::string& where) {
  if (!map.contains(key) || map[key].is_null()) return {};
  if (!map[key].is_string()) fail(where, ": expected a string, found ", map[key].dump());
  return map[key].get<std::string>();
}

// The registry names, out of the maps (after every override, so that
// `--set data.dataset_param.dataset_type=x` is seen).
void derive_names(DataConfig& d, const ConfigCheck& check) {
  d.dataset_type = optional_string(d.dataset_param, "dataset_type", check.where("dataset_param.dataset_type"));
  const auto& collate = d.loader.collate_param;
  if (!collate.is_object())
    fail(check.where("dataloader_param.collate_param"), ": expected a map, found ", collate.dump());
  d.collate_model_name =
      optional_string(collate, "model_name", check.where("dataloader_param.collate_param.model_name"));
  const auto& collator_id = d.loader.collator_id;
  if (!collator_id.empty()) {
    if (!d.collate_model_name.empty() && d.collate_model_name != collator_id)
      fail(check.where("dataloader_param.collator_id"), ": '", collator_id, "' disagrees with ",
           check.path("dataloader_param.collate_param.model_name"), " '", d.collate_model_name, "': give one");
    d.collate_model_name = collator_id;
  }
}

}  // namespace

void LoaderConfig::declare(ConfigSection<LoaderConfig>& s) {
  s.field("shuffle", &LoaderConfig::shuffle)
      .field("drop_last", &LoaderConfig::drop_last)
      .field("num_workers", &LoaderConfig::num_workers)
      .field("prefetch_factor", &LoaderConfig::prefetch_factor)
      .field("pin_memory", &LoaderConfig::pin_memory)
      .field("micro_batch_tokens", &LoaderConfig::micro_batch_tokens)
      .field("balance_dp", &LoaderConfig::balance_dp)
      .field("over_budget_samples", &LoaderConfig::over_budget_samples)
      .field("sampler_type", &LoaderConfig::sampler_type)
      .field("dataloader_mode", &LoaderConfig::dataloader_mode)
      .field("collator_id", &LoaderConfig::collator_id)
      .field("collate_param", &LoaderConfig::collate_param)
      .check([](const LoaderConfig& l, const ConfigCheck& check) {
        check.at_least("num_workers", l.num_workers, 0);
        check.at_least("prefetch_factor", l.prefetch_factor, 1);
        check.at_least("micro_batch_tokens", l.micro_batch_tokens, 0);
        if (l.micro_batch_tokens > kMaxTokens)
          check.invalid("micro_batch_tokens", "at most 2^32 (" + std::to_string(kMaxTokens) + ") tokens",
                        std::to_string(l.micro_batch_tokens));
        check.one_of("over_budget_samples", l.over_budget_samples, {"error", "skip"});
        // Both shape token-budget micro-batches only: without a budget they would mean nothing.
        if (l.micro_batch_tokens == 0 && !l.balance_dp)
          check.invalid("balance_dp", "true (it applies to micro_batch_tokens, which is not set)", "false");
        if (l.micro_batch_tokens == 0 && l.over_budget_samples != "error")
          check.invalid("over_budget_samples", "error (it applies to micro_batch_tokens, which is not set)",
                        l.over_budget_samples);
        // One sampler and one mode exist; other names would silently mean something else.
        check.one_of("sampler_type", l.sampler_type, {"BaseRandomBatchSampler"});
        check.one_of("dataloader_mode", l.dataloader_mode, {"sampler"});
      });
}

void DataConfig::declare(ConfigSection<DataConfig>& s) {
  s.field("dataset_param", &DataConfig::dataset_param)
      .section("dataloader_param", &DataConfig::loader, LoaderConfig::declare)
      .field("validation", &DataConfig::validation)
      .field("validation_split", &DataConfig::validation_split)
      .derive(derive_names)
      .check([](const DataConfig& d, const ConfigCheck& check) {
        if (!d.validation.is_object()) check.invalid("validation", "a data set section (a map)", d.validation.dump());
        if (!(d.validation_split >= 0.0 && d.validation_split < 1.0))
          check.invalid("validation_split", "a fraction in (0, 1) held out of the training set (0: none)",
                        ConfigCheck::number(d.validation_split));
        if (!d.validation.empty() && d.validation_split > 0.0)
          check.invalid("validation_split", "0 when data.validation names a validation set (one or the other)",
                        ConfigCheck::number(d.validation_split));
        for (const auto& key : kTrainingDrawKeys)
          if (d.validation.contains(key) && (!d.dataset_param.contains(key) || d.dataset_param[key] != d.validation[key]))
            check.invalid("validation." + key,
                          "the training section's value (" +
                              (d.dataset_param.contains(key) ? d.dataset_param[key].dump() : std::string("its default")) +
                              "): evaluation measures the loss at the training distribution's timesteps",
                          d.validation[key].dump());
        if (d.validation.contains("dataset_type") && !d.validation["dataset_type"].is_string())
          check.invalid("validation.dataset_type", "a data set type (a string)", d.validation["dataset_type"].dump());
      });
}

DataConfig DataConfig::validation_data() const {
  DataConfig out = *this;
  out.dataset_param = validation;
  if (!out.dataset_param.contains("dataset_type")) out.dataset_param["dataset_type"] = dataset_type;
  if (out.dataset_param["dataset_type"] == dataset_type)  // another type may not know the keys
    for (const auto& key : kTrainingDrawKeys)
      if (dataset_param.contains(key)) out.dataset_param[key] = dataset_param[key];
  out.dataset_type = out.dataset_param["dataset_type"].get<std::string>();
  out.validation = nlohmann::json::object();
  out.validation_split = 0.0;
  return out;
}

}  // namespace mmtrain
