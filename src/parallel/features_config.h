// FeaturesConfig: the `features` section, the memory features the parallelize chain applies
// besides FSDP (recompute, activation offload), LoRA fine-tuning and the loss reduction the
// trainer uses.
#pragma once
#include "nn/lora.h"

#include <string>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct RecomputePlanConfig {
  std::vector<std::string> apply_modules;      // module patterns whose activations are recomputed in backward
  bool use_reentrant = true;                   // mmtrain's recompute is the reentrant form (MindSpeed's default is false)
};

struct FeaturesConfig {
  std::string loss_type = "raw";               // features.loss_cfg.loss_type: default|raw|per-sample|per-token
  bool recompute = false;                      // activation recompute on recompute_plan.apply_modules
  RecomputePlanConfig recompute_plan;
  bool enable_activation_offload = false;      // saved activations of the selected blocks go to the host
  std::vector<std::string> activation_offload_modules;   // activation_offload_plan.apply_modules
  bool enable_lora = false;                    // LoRA adapters on lora.target_modules, the rest frozen (nn/lora.h)
  LoraConfig lora;

  static void declare(ConfigSection<FeaturesConfig>& section);
};

}  // namespace mmtrain
