// What a config names in the registries: its model's spec (model.model_id) and its data set
// (data.dataset_param.dataset_type), each failing with the key and the known names. The trainer,
// the planner and the tools look them up here, so a config names a model or data set one way.
#pragma once
#include "config/config.h"
#include "data/dataset.h"
#include "models/model_spec.h"

#include <memory>

namespace mmtrain {

// The spec of config's model.model_id.
const ModelSpec& config_model_spec(const Config& config);
// The config's dataset, built from the dataset registry.
std::shared_ptr<Dataset> build_dataset(const Config& config);
// A full fine-tuning preference run's reference copy as a Module tree (shapes only; nothing is
// allocated until FSDP shards it): the model, every parameter frozen, the Linears
// training.dpo.reference_quant names stored quantized (nn/lora.h's quantize_frozen_linears). The
// run builds it (train/preference_reference.h), the planner sizes it.
std::shared_ptr<Model> build_reference_model(const Config& config);

}  // namespace mmtrain
