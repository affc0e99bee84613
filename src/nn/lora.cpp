#include "nn/lora.h"

#include "core/config_schema.h"
#include "core/error.h"
#include "core/module_pattern.h"
#include "nn/layers.h"
#include "quant/quantized_rows.h"

#include <cmath>
#include <set>

namespace mmtrain {

double LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

namespace {
thread_local bool adapters_on = true;
}  // namespace

LoraAdaptersOff::LoraAdaptersOff() : was_on_(adapters_on) { adapters_on = false; }
LoraAdaptersOff::~LoraAdaptersOff() { adapters_on = was_on_; }
bool lora_adapters_on() { return adapters_on; }

void LoraConfig::declare(ConfigSection<LoraConfig>& s) {
  s.field("rank", &LoraConfig::rank)
      .field("alpha", &LoraConfig::alpha)
      .field("dropout", &LoraConfig::dropout)
      .field("target_modules", &LoraConfig::target_modules)
      .field("use_rslora", &LoraConfig::use_rslora)
      .field("init", &LoraConfig::init)
      .field("modules_to_save", &LoraConfig::modules_to_save)
      .field("adapter_dtype", &LoraConfig::adapter_dtype)
      .field("base_quant", &LoraConfig::base_quant)
      .check([](const LoraConfig& c, const ConfigCheck& check) {
        check.at_least("rank", c.rank, 1);
        if (!(c.alpha > 0.0) || !std::isfinite(c.alpha))
          check.invalid("alpha", "a positive number", ConfigCheck::number(c.alpha));
        check.in_unit("dropout", c.dropout, /*include_one=*/false);
        if (c.dropout != 0.0)  // the mask would have to replay under recompute and agree across CP ranks
          check.invalid("dropout", "0 (LoRA dropout is not implemented yet)", ConfigCheck::number(c.dropout));
        check.one_of("init", c.init, {"kaiming", "gaussian"});
        check.one_of("base_quant", c.base_quant, {"none", "nf4", "int8", "fp8_e4m3"});
        check.module_patterns("target_modules", c.target_modules);
        check.module_patterns("modules_to_save", c.modules_to_save);
      });
}

namespace {

std::vector<std::pair<std::string, Module*>> matching_modules(Module& model, const std::vector<std::string>& patterns,
                                                              const std::string& key) {
  std::vector<ModulePattern> parsed(patterns.begin(), patterns.end());
  std::vector<bool> used(patterns.size(), false);
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [name, module] : model.named_modules()) {
    bool hit = false;
    for (size_t i = 0; i < parsed.size(); ++i)
      if (parsed[i].matches(name)) hit = used[i] = true;
    if (hit) out.emplace_back(name, module);
  }
  for (size_t i = 0; i < patterns.size(); ++i)
    if (!used[i]) fail(key, ": pattern '", patterns[i], "' matches no module of the model");
  return out;
}

}  // namespace

LoraSummary apply_lora(Module& model, const LoraConfig& config, const std::vector<std::string>& default_targets,
                       const std::vector<std::string>& supported) {
  const std::vector<ModulePattern> adaptable(supported.begin(), supported.end());
  const auto& patterns = config.target_modules.empty() ? default_targets : config.target_modules;
  if (patterns.empty())
    fail("features.lora.target_modules: this model names no default targets; list the Linear modules to adapt");
  LoraSummary summary;
  // The modules to save, and everything under them (a pattern names a module, its params train).
  std::set<std::string> saved;
  for (auto& [name, module] : matching_modules(model, config.modules_to_save, "features.lora.modules_to_save")) {
    for (auto& [param_name, param] : module->named_parameters(name))
      if (param->trainable && !param->requires_grad)
        fail("features.lora.modules_to_save: '", param_name, "' is frozen by the model itself (e.g. ",
             "model.config.freeze_vision), so it cannot train in full");
    saved.insert(name);
  }
  auto under_saved = [&](const std::string& name) {
    for (const auto& s : saved)
      if (name == s || name.rfind(s + ".", 0) == 0) return true;
    return false;
  };
  for (auto& [name, module] : matching_modules(model, patterns, "features.lora.target_modules")) {
    auto* linear = dynamic_cast<Linear*>(module);
    if (!linear) fail("features.lora.target_modules: '", name, "' is not a Linear layer (LoRA adapts Linear layers)");
    bool is_adaptable = false;
    for (const auto& pattern : adaptable) is_adaptable = is_adaptable || pattern.matches(name);
    if (!is_adaptable) {
      std::string listed;
      for (const auto& p : supported) listed += (listed.empty() ? "" : ", ") + p;
      fail("features.lora.target_modules: '", name, "' is computed from its raw weight, without the adapter path; ",
           "this model adapts ", listed.empty() ? std::string("no layer") : listed);
    }
    if (under_saved(name))
      fail("features.lora: '", name, "' is both a target (target_modules) and trained in full (modules_to_save)");
    if (!linear->weight.requires_grad)  // its block runs without a graph: the adapter would never train
      fail("features.lora.target_modules: '", name, "' is frozen by the model itself (e.g. ",
           "model.config.freeze_vision: false to adapt the vision tower)");
    const int64_t out = linear->out_features() / linear->experts(), in = linear->in_features();
    if (config.rank > std::min(out, in))
      fail("features.lora.rank: ", config.rank, " is above min(in, out) = ", std::min(out, in), " of '", name,
           "' [", out, ", ", in, "]");
    summary.adapted.push_back(name);
  }
  // Freeze first, then add the adapters (whose params train).
  for (auto& [name, param] : model.named_parameters())
    if (param->trainable && !under_saved(name.substr(0, name.rfind('.')))) param->requires_grad = false;
  for (const auto& name : summary.adapted)
    for (auto& [module_name, module] : model.named_modules())
      if (module_name == name) {
        auto& linear = dynamic_cast<Linear&>(*module);
        linear.attach_lora(config.rank, config.scale(), config.init == "gaussian", config.adapter_dtype);
        for (Param* p : {&linear.lora_A->weight, &linear.lora_B->weight}) {
          int64_t n = 1;
          for (int64_t d : p->shape) n *= d;
          summary.adapter_params += n;
        }
      }
  // The frozen base's storage: every frozen weight of an adaptable Linear (modules_to_save train).
  quantize_frozen_linears(model, quant::parse_base_quant(config.base_quant, "features.lora.base_quant"), supported);
  summary.trainable_params = trainable_param_count(model);
  return summary;
}

int64_t quantize_frozen_linears(Module& model, quant::BaseQuant kind, const std::vector<std::string>& supported) {
  if (kind == quant::BaseQuant::none) return 0;
  const std::vector<ModulePattern> adaptable(supported.begin(), supported.end());
  int64_t marked = 0;
  for (auto& [name, module] : model.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(module);
    bool is_adaptable = false;
    for (const auto& pattern : adaptable) is_adaptable = is_adaptable || pattern.matches(name);
    if (linear && is_adaptable && !linear->weight.requires_grad && quant::row_quantizable(kind, linear->weight.shape)) {
      linear->weight.base_quant = kind;
      ++marked;
    }
  }
  return marked;
}

namespace {

int64_t param_count(Module& model, bool trained_only) {
  int64_t total = 0;
  for (auto& [name, param] : model.named_parameters()) {
    if (!param->trainable || (trained_only && !param->requires_grad)) continue;
    int64_t n = 1;
    for (int64_t d : param->shape) n *= d;
    total += n;
  }
  return total;
}

}  // namespace

int64_t trainable_param_count(Module& model) { return param_count(model, true); }
int64_t total_param_count(Module& model) { return param_count(model, false); }

}  // namespace mmtrain
