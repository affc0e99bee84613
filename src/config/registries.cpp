#include "config/registries.h"

#include "nn/lora.h"

namespace mmtrain {

const ModelSpec& config_model_spec(const Config& config) {
  return model_spec(config.model.model_id, "config " + config.source_path + ": model.model_id");
}

std::shared_ptr<Model> build_reference_model(const Config& config) {
  const ModelSpec& spec = config_model_spec(config);
  auto model = spec.build(config.model.config);
  for (auto& [name, param] : model->named_parameters())
    if (param->trainable) param->requires_grad = false;
  const auto kind = quant::parse_base_quant(config.training.dpo.reference_quant, "training.dpo.reference_quant");
  quantize_frozen_linears(*model, kind, spec.lora_supported_targets);
  return model;
}

std::shared_ptr<Dataset> build_dataset(const Config& c) {
  return dataset_registry().get(c.data.dataset_type, "config " + c.source_path + ": data.dataset_param.dataset_type")(
      c.data, c.model);
}

}  // namespace mmtrain
