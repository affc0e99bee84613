#include "train/preference_reference.h"

#include "train/build.h"
#include "config/registries.h"
#include "nn/lora.h"
#include "train/lora_base.h"

#include <optional>

namespace mmtrain {

ModelOutput reference_forward_only(Model& model, Fsdp& fsdp, PreferenceReference* reference,
                                   const std::function<ModelOutput(Model&)>& forward) {
  at::NoGradGuard no_grad;
  Model& scored = reference ? *reference->model : model;
  Fsdp& units = reference ? *reference->fsdp : fsdp;
  std::optional<LoraAdaptersOff> base;
  if (!reference) base.emplace();  // the base: the same units, the adapters off
  units.begin_forward();
  ModelOutput out = forward(scored);
  units.finish_forward_only();
  return out;
}

std::shared_ptr<PreferenceReference> build_preference_reference(const Config& config, const DeviceMesh& mesh,
                                                                std::shared_ptr<OffloadTiers> tiers) {
  if (!config_needs_reference_copy(config)) return nullptr;
  auto reference = std::make_shared<PreferenceReference>();
  reference->model = build_reference_model(config);
  reference->fsdp = parallelize_model(config, *reference->model, mesh, std::move(tiers));
  load_initial_weights(config, *reference->model, *reference->fsdp);
  return reference;
}

nlohmann::json preference_reference_identity(const Config& config, Comm* comm) {
  if (!config_needs_reference_copy(config)) return nullptr;
  nlohmann::json identity = initial_weights_identity(config, comm);
  if (config.training.dpo.reference_quant != "none") identity["quant"] = config.training.dpo.reference_quant;
  return identity;
}

std::string preference_reference_difference(const nlohmann::json& trainer_state, const nlohmann::json& run) {
  const auto saved = trainer_state.value("preference_reference", nlohmann::json());
  if (run.is_null()) return "";  // no reference now: nothing to continue
  if (saved.is_null())
    return "it was not trained against a frozen reference (training.objective sft, or LoRA), and this run's dpo "
           "would take " + lora_base_describe(run) + " as its reference, not the weights it starts from; to tune "
           "these weights from preferences, export them (mmtrain convert MODEL ckpt-to-hf) and start a new run "
           "with model.checkpoint_path set to the export";
  if (!saved.is_object()) return "its preference_reference " + saved.dump() + " is not an object";
  const nlohmann::json unquantized = "none";
  if (saved.value("quant", unquantized) != run.value("quant", unquantized))
    return "its preference reference was stored as " + saved.value("quant", unquantized).dump() +
           " (training.dpo.reference_quant), this run's as " + run.value("quant", unquantized).dump() +
           "; a dpo run continues against the reference it started with";
  const bool same = saved.contains("init_seed") || run.contains("init_seed")
                        ? saved.value("init_seed", nlohmann::json()) == run.value("init_seed", nlohmann::json())
                        : saved.value("fingerprint", nlohmann::json()) == run.value("fingerprint", nlohmann::json());
  if (same) return "";
  return "its preference reference was " + lora_base_describe(saved) + ", and this run's is " +
         lora_base_describe(run) + "; a dpo run continues against the reference it started with";
}

}  // namespace mmtrain
