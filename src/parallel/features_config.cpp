#include "parallel/features_config.h"

#include "core/config_schema.h"

namespace mmtrain {
namespace {

void declare_recompute_plan(ConfigSection<RecomputePlanConfig>& s) {
  s.field("apply_modules", &RecomputePlanConfig::apply_modules)
      .field("use_reentrant", &RecomputePlanConfig::use_reentrant);
}

}  // namespace

void FeaturesConfig::declare(ConfigSection<FeaturesConfig>& s) {
  s.map("loss_cfg").field("loss_type", &FeaturesConfig::loss_type);
  s.field("recompute", &FeaturesConfig::recompute)
      .section("recompute_plan", &FeaturesConfig::recompute_plan, declare_recompute_plan)
      .field("enable_activation_offload", &FeaturesConfig::enable_activation_offload)
      .field("enable_lora", &FeaturesConfig::enable_lora)
      .section("lora", &FeaturesConfig::lora, LoraConfig::declare);
  s.map("activation_offload_plan").field("apply_modules", &FeaturesConfig::activation_offload_modules);
  s.check([](const FeaturesConfig& f, const ConfigCheck& check) {
    check.one_of("loss_cfg.loss_type", f.loss_type, {"default", "raw", "per-sample", "per-token"});
    if (f.recompute && f.recompute_plan.apply_modules.empty())
      check.invalid("recompute_plan.apply_modules", "at least one module pattern when features.recompute is true",
                    "an empty list");
    if (f.enable_activation_offload && f.activation_offload_modules.empty())
      check.invalid("activation_offload_plan.apply_modules",
                    "at least one module pattern when features.enable_activation_offload is true", "an empty list");
    if (!f.enable_lora && f.lora.base_quant != "none")
      check.invalid("lora.base_quant", "none unless features.enable_lora is true (only LoRA keeps the base frozen)",
                    f.lora.base_quant);
    check.module_patterns("recompute_plan.apply_modules", f.recompute_plan.apply_modules);
    check.module_patterns("activation_offload_plan.apply_modules", f.activation_offload_modules);
  });
}

}  // namespace mmtrain
