// ModelConfig: the `model` section. Which model (model_id, a name in the model spec registry),
// its weights, and its dimensions as a free-form map the model's own config reader checks.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct ModelConfig {
  std::string model_id;                        // model spec name, e.g. "magihuman", "mistral3"
  std::string model_name_or_path;              // HF weights directory or safetensors file; empty = random init
  std::string checkpoint_path;                 // preferred over model_name_or_path when set
  bool enable_gradient_checkpointing = false;  // the model's own checkpointing (refused: features.recompute does it)
  nlohmann::json config = nlohmann::json::object();  // model-specific dimensions (`model.config:` map)

  // checkpoint_path when set, else model_name_or_path (the seed's rule); "" = random init.
  const std::string& weights_path() const { return checkpoint_path.empty() ? model_name_or_path : checkpoint_path; }

  static void declare(ConfigSection<ModelConfig>& section);
};

}  // namespace mmtrain
