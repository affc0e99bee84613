// The frozen reference of a preference objective under full fine-tuning (train/objective.h).
// Under LoRA none is built: the reference is the model with its adapters off. Full fine-tuning
// changes every weight, so the reference is a second copy of the run's initial weights
// (model.checkpoint_path / model_name_or_path, or the seeded init), every parameter frozen and
// sharded by the same parallelize chain as the model: each rank holds 1/fsdp of it in
// param_dtype (the dtype frozen parameters keep), or its Linears in training.dpo.reference_quant's
// codes and scales, with no gradient and no optimizer state.
// Its identity (that of the initial weights) is recorded in every checkpoint
// ("preference_reference") and required again on resume.
#pragma once
#include "config/config.h"
#include "dist/comm.h"
#include "dist/device_mesh.h"
#include "fsdp/fully_shard.h"
#include "models/model.h"
#include "offload/offload_tiers.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

namespace mmtrain {

struct PreferenceReference {
  std::shared_ptr<Model> model;
  std::unique_ptr<Fsdp> fsdp;
};

// The reference copy, its weights loaded (collective over mesh); null when none is needed
// (config_needs_reference_copy).
std::shared_ptr<PreferenceReference> build_preference_reference(const Config& config, const DeviceMesh& mesh,
                                                                std::shared_ptr<OffloadTiers> tiers = nullptr);

// One no-grad forward of the reference: `forward` run on the frozen copy when there is one, else on
// `model` with its LoRA adapters off (the base), between that model's FSDP begin_forward and
// finish_forward_only. What each preference objective scores its reference with (train/objective.h,
// train/grpo_objective.h).
ModelOutput reference_forward_only(Model& model, Fsdp& fsdp, PreferenceReference* reference,
                                   const std::function<ModelOutput(Model&)>& forward);

// What a checkpoint records of the reference (train/lora_base.h's initial_weights_identity);
// null when no copy is needed. With comm: collective, as initial_weights_identity.
nlohmann::json preference_reference_identity(const Config& config, Comm* comm = nullptr);

// "" when a checkpoint (its trainer_state.json, saved) may continue a run whose reference is run
// (preference_reference_identity); else why not, naming both.
std::string preference_reference_difference(const nlohmann::json& trainer_state, const nlohmann::json& run);

}  // namespace mmtrain
