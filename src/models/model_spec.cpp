#include "models/model_spec.h"

namespace mmtrain {

Registry<ModelSpec>& model_spec_registry() {
  static Registry<ModelSpec> registry("model");
  return registry;
}

const ModelSpec& model_spec(const std::string& model_id, const std::string& where) {
  return model_spec_registry().get(model_id, where);
}

std::shared_ptr<const HfAdapter> make_hf_adapter(const ModelSpec& spec, const nlohmann::json& model_config) {
  if (spec.hf_adapter) return spec.hf_adapter(model_config);
  return std::make_shared<HfAdapter>();
}

ModelSpecRegistration::ModelSpecRegistration(ModelSpec spec) {
  const std::string name = spec.name;
  model_spec_registry().add(name, std::move(spec));
}

}  // namespace mmtrain
