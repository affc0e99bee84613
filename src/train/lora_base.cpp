#include "train/lora_base.h"

#include "core/error.h"
#include "core/text.h"
#include "train/hf_weights.h"

namespace mmtrain {

nlohmann::json lora_adapters(const LoraConfig& lora) {
  return {{"rank", lora.rank},
          {"alpha", lora.alpha},
          {"use_rslora", lora.use_rslora},
          {"target_modules", lora.target_modules},
          {"modules_to_save", lora.modules_to_save},
          {"base_quant", lora.base_quant}};
}

nlohmann::json initial_weights_identity(const Config& config, Comm* comm) {
  const std::string& path = config.model.weights_path();
  nlohmann::json base;
  if (path.empty()) {
    base = {{"init_seed", config.training.seed}};
  } else {
    std::string fingerprint, failed;
    if (!comm || comm->rank() == 0) {
      try {
        fingerprint = weights_fingerprint(path);
      } catch (const Error& e) {
        if (!comm) throw;
        failed = e.what();
      }
    }
    if (comm && comm->any_rank(!failed.empty())) {
      if (!failed.empty()) fail(failed);
      fail("rank 0 could not read the base ", path, " for its fingerprint (see its error)");
    }
    if (comm && comm->world_size() > 1) {  // 64 hex digits as eight 32-bit words, each exact in a double
      std::vector<double> words(8, 0.0);
      if (comm->rank() == 0)
        for (size_t i = 0; i < words.size(); ++i) words[i] = double(std::stoul(fingerprint.substr(8 * i, 8), nullptr, 16));
      words = comm->all_reduce_sum(words);
      fingerprint.clear();
      for (const double word : words) fingerprint += format("%08x", static_cast<unsigned>(word));
    }
    base = {{"weights", path}, {"fingerprint", fingerprint}, {"fingerprint_of", kWeightsFingerprintKind}};
  }
  return base;
}

nlohmann::json lora_base(const Config& config, Comm* comm) {
  if (!config.features.enable_lora) return nullptr;
  nlohmann::json base = initial_weights_identity(config, comm);
  base["adapters"] = lora_adapters(config.features.lora);
  return base;
}

nlohmann::json lora_adapters_of_checkpoint(const nlohmann::json& trainer_state) {
  const auto& base = trainer_state.at("lora_base");
  if (base.is_object() && base.contains("adapters")) {
    nlohmann::json adapters = base["adapters"];
    if (adapters.is_object() && !adapters.contains("base_quant")) adapters["base_quant"] = "none";  // before QLoRA
    return adapters;
  }
  nlohmann::json adapters = lora_adapters(LoraConfig{});  // keys the saved config leaves out keep their defaults
  const auto config = trainer_state.value("config", nlohmann::json::object());
  const auto features = config.is_object() ? config.value("features", nlohmann::json::object()) : nlohmann::json();
  const auto lora = features.is_object() ? features.value("lora", nlohmann::json::object()) : nlohmann::json();
  if (lora.is_object())
    for (auto& [key, value] : adapters.items())
      if (lora.contains(key)) value = lora[key];
  return adapters;
}

std::string lora_adapters_difference(const nlohmann::json& saved, const nlohmann::json& run) {
  for (const auto& [key, value] : run.items()) {
    const auto found = saved.is_object() && saved.contains(key) ? saved[key] : nlohmann::json();
    if (found != value)  // numbers compare by value: 16 == 16.0
      return "features.lora." + key + " is " + value.dump() + " in this config, and the checkpoint's adapters were "
             "trained with " + (found.is_null() ? std::string("none recorded") : found.dump()) +
             " (the same adapters under another " + key + " compute another model)";
  }
  return "";
}

std::string lora_base_describe(const nlohmann::json& base) {
  if (!base.is_object()) return "an unreadable base " + base.dump();
  if (base.contains("init_seed")) return "a random init with seed " + base["init_seed"].dump();
  auto text = [&](const char* key) {
    return base.contains(key) && base[key].is_string() ? base[key].get<std::string>() : std::string("?");
  };
  return "weights " + text("weights") + " (fingerprint " + text("fingerprint") + ")";
}

std::string lora_base_difference(const nlohmann::json& saved, const nlohmann::json& run) {
  if (!saved.is_object() || !(saved.contains("init_seed") || (saved.contains("weights") && saved.contains("fingerprint"))))
    return "its lora_base " + saved.dump() + " is not {\"weights\", \"fingerprint\"} or {\"init_seed\"}";
  if (saved.contains("init_seed") || run.contains("init_seed")) {
    if (saved.value("init_seed", nlohmann::json()) == run.value("init_seed", nlohmann::json())) return "";
  } else if (saved.value("fingerprint_of", nlohmann::json()) != kWeightsFingerprintKind) {
    const auto kind = saved.value("fingerprint_of", nlohmann::json("over the first row of each tensor"));
    return "its base's fingerprint " + saved["fingerprint"].dump() + " was taken by an older mmtrain (" +
           (kind.is_string() ? kind.get<std::string>() : kind.dump()) + "), which a changed or substituted base can "
           "match; this base has " + lora_base_describe(run) +
           "; if it is the same base, set trainer_state.json's lora_base.fingerprint to " +
           run.value("fingerprint", std::string("?")) + " and fingerprint_of to \"" + kWeightsFingerprintKind + "\"";
  } else if (saved["fingerprint"] == run.value("fingerprint", nlohmann::json())) {
    return "";
  }
  return "its adapters were trained over " + lora_base_describe(saved) + ", and this run's base is " +
         lora_base_describe(run) + "; adapters belong to the base they were trained on";
}

}  // namespace mmtrain
