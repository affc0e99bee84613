#include "config/registries.h"

namespace mmtrain {

const ModelSpec& config_model_spec(const Config& config) {
  return model_spec(config.model.model_id, "config " + config.source_path + ": model.model_id");
}

std::shared_ptr<Dataset> build_dataset(const Config& c) {
  return dataset_registry().get(c.data.dataset_type, "config " + c.source_path + ": data.dataset_param.dataset_type")(
      c.data, c.model);
}

}  // namespace mmtrain
