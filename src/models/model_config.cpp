#include "models/model_config.h"

#include "core/config_schema.h"

namespace mmtrain {

void ModelConfig::declare(ConfigSection<ModelConfig>& s) {
  s.field("model_id", &ModelConfig::model_id)
      .field("model_name_or_path", &ModelConfig::model_name_or_path)
      .field("checkpoint_path", &ModelConfig::checkpoint_path)
      .field("enable_gradient_checkpointing", &ModelConfig::enable_gradient_checkpointing)
      .field("config", &ModelConfig::config)
      .check([](const ModelConfig& m, const ConfigCheck& check) {
        if (m.model_id.empty()) check.invalid("model_id", "a registered model name", "nothing");
      });
}

}  // namespace mmtrain
