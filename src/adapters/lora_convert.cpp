#include "adapters/lora_convert.h"

#include "adapters/quantize_base.h"
#include "config/config.h"
#include "config/registries.h"
#include "convert/base_files.h"
#include "convert/conversion_output.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/json_read.h"
#include "core/module_pattern.h"
#include "core/text.h"
#include "dist/comm.h"
#include "io/safetensors.h"
#include "io/user_file.h"
#include "nn/layers.h"
#include "nn/lora.h"
#include "train/build.h"
#include "train/hf_weights.h"
#include "train/lora_base.h"
#include "train/state.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

namespace mmtrain {
namespace fs = std::filesystem;

namespace {

// A LoRA run's checkpoint with what it takes to read it: the run's config (from its
// trainer_state.json, through the same parser as a YAML), the model with its adapters, the
// adapted Linears by name, and the model's HF adapter.
struct LoraCheckpoint {
  std::unique_ptr<CheckpointReader> reader;
  Config config;
  std::shared_ptr<Model> model;
  std::map<std::string, Linear*> adapted;
  std::shared_ptr<const HfAdapter> hf;
  nlohmann::json base;  // trainer_state.json's lora_base
  bool ema = false;     // --ema: the trained tensors' EMA shadows (training.ema) in place of their values

  // A trained tensor (an adapter, a module to save) as the export takes it.
  at::Tensor trained(const std::string& name) const {
    return reader->read_full(ema ? state_ema_key(name) : state_model_key(name));
  }
};

// The Linears apply_lora adapted, by name.
std::map<std::string, Linear*> adapted_linears(Module& model, const LoraSummary& summary) {
  const std::set<std::string> adapted(summary.adapted.begin(), summary.adapted.end());
  std::map<std::string, Linear*> linears;
  for (auto& [name, module] : model.named_modules())
    if (adapted.count(name)) linears[name] = dynamic_cast<Linear*>(module);
  return linears;
}

LoraCheckpoint open_lora_checkpoint(const std::string& model_id, const std::string& load_dir, const std::string& command,
                                    bool ema) {
  LoraCheckpoint out;
  out.reader = std::make_unique<CheckpointReader>(load_dir);
  out.ema = ema;
  const auto& global = out.reader->global_state();
  if (ema && !global.contains("ema"))
    fail(command, " --ema: ", out.reader->dir(), " holds no EMA weights (it was trained without training.ema)");
  const std::string where = out.reader->dir() + "/trainer_state.json";
  if (global.value("model_id", "") != model_id)
    fail(command, ": ", out.reader->dir(), " holds model '", global.value("model_id", ""), "', not '", model_id, "'");
  if (!global.contains("lora_base") || !global.contains("config"))
    fail(command, ": ", out.reader->dir(), " holds no LoRA adapters (not the checkpoint of a run with features.enable_lora)");
  out.base = global["lora_base"];
  if (!out.base.is_object() || !(out.base.contains("init_seed") ||
                                 (out.base.contains("weights") && out.base["weights"].is_string() &&
                                  out.base.contains("fingerprint") && out.base["fingerprint"].is_string())))
    fail(command, ": ", where, ": lora_base is ", out.base.dump(), ", not {\"weights\": path, \"fingerprint\": hex} or ",
         "{\"init_seed\": N}");
  out.config = config_from_yaml_string(global["config"].dump(), where);
  // What the adapters were recorded as must be what the saved config builds (an edited
  // trainer_state.json must not change their scale or membership in silence).
  if (const auto why = lora_adapters_difference(lora_adapters_of_checkpoint(global), lora_adapters(out.config.features.lora));
      !why.empty())
    fail(command, ": ", where, ": its config and its lora_base disagree: ", why);
  const ModelSpec& spec = model_spec(model_id, command);
  out.model = spec.build(out.config.model.config);
  out.adapted = adapted_linears(
      *out.model, apply_lora(*out.model, out.config.features.lora, spec.lora_default_targets, spec.lora_supported_targets));
  for (auto& [name, param] : out.model->named_parameters()) {  // every trained tensor, at the model's shape
    if (!param->trainable || !param->requires_grad) continue;
    const auto key = ema ? state_ema_key(name) : state_model_key(name);
    if (!out.reader->contains(key)) fail(command, ": ", out.reader->dir(), " has no '", key, "', which its features.lora trains");
    if (out.reader->global_shape(key) != param->shape)
      fail(command, ": ", out.reader->dir(), ": '", key, "' has shape ", shape_str(out.reader->global_shape(key)),
           ", its features.lora makes it ", shape_str(param->shape));
  }
  out.hf = make_hf_adapter(spec, out.config.model.config);
  return out;
}

// The base the adapters of ckpt sit on: the recorded weights, or base_dir (the same weights moved),
// checked against the recorded fingerprint; null for a random-init base.
std::unique_ptr<WeightSource> open_lora_base(const LoraCheckpoint& ckpt, const std::string& base_dir,
                                             const std::string& command) {
  if (ckpt.base.contains("init_seed")) {
    if (!base_dir.empty())
      fail(command, ": --base ", base_dir, ": the adapters of ", ckpt.reader->dir(), " were trained over ",
           lora_base_describe(ckpt.base), ", not over weights");
    return nullptr;
  }
  const std::string path = base_dir.empty() ? ckpt.base["weights"].get<std::string>() : base_dir;
  nlohmann::json now = {{"weights", path}, {"fingerprint", weights_fingerprint(path)},
                        {"fingerprint_of", kWeightsFingerprintKind}};
  if (const auto why = lora_base_difference(ckpt.base, now); !why.empty())
    fail(command, ": ", ckpt.reader->dir(), ": ", why, base_dir.empty() ? " (moved? name it with --base DIR)" : "");
  return std::make_unique<WeightSource>(path);
}

// "model.language_model.layers.0.self_attn.q_proj" -> its HF module path (the HF key of its
// weight without ".weight").
std::string hf_module(const HfAdapter& hf, const std::string& module) {
  const std::string key = hf.hf_key(module + ".weight");
  if (key.size() < 7 || key.compare(key.size() - 7, 7, ".weight") != 0)
    fail("lora: the HF key of '", module, ".weight' is '", key, "', which does not end in .weight");
  return key.substr(0, key.size() - 7);
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) fail("cannot write ", path.string());
}

// PEFT's target_modules: the layers' own names (q_proj, ...) when they name exactly the adapted
// layers among the model's Linears, as peft and vLLM expect; else a regex of the full names
// (peft matches a string with re.fullmatch).
nlohmann::json peft_target_modules(Module& model, const HfAdapter& hf, const std::map<std::string, Linear*>& adapted) {
  std::set<std::string> short_names;
  for (const auto& [name, linear] : adapted) short_names.insert(name.substr(name.rfind('.') + 1));
  bool exact = true;
  for (auto& [name, module] : model.named_modules()) {
    if (!dynamic_cast<Linear*>(module) || name.find("lora_") != std::string::npos) continue;
    if (short_names.count(name.substr(name.rfind('.') + 1)) && !adapted.count(name)) exact = false;
  }
  if (exact) return std::vector<std::string>(short_names.begin(), short_names.end());
  std::string alternation;
  for (const auto& [name, linear] : adapted)
    alternation += (alternation.empty() ? "" : "|") + std::regex_replace(hf_module(hf, name), std::regex(R"(\.)"), R"(\.)");
  return "^(?:" + alternation + ")$";
}

// An adapter_config.json field is accepted only when mmtrain implements it (r, lora_alpha and
// use_rslora are compared with the config by the caller; target_modules, modules_to_save, bias and
// init_lora_weights are checked here), when it only describes the file or peft's runtime, or when
// it is at peft's default. Every other field is refused by name, so a peft release that adds a
// setting changing the adapter (alora_invocation_tokens, arrow_config, ...) cannot slip through as
// plain LoRA.
void refuse_unimplemented_peft_fields(const nlohmann::json& adapter_config, const std::string& where) {
  static const std::set<std::string> kImplemented = {"peft_type", "r", "lora_alpha", "use_rslora", "target_modules",
                                                     "modules_to_save", "bias", "init_lora_weights"};
  // What the file is, where it came from, and peft's runtime: nothing the adapter computes.
  static const std::set<std::string> kDescriptive = {"task_type", "auto_mapping", "peft_version", "base_model_name_or_path",
                                                     "revision", "inference_mode", "lora_dropout", "runtime_config"};
  // peft's defaults that are not null / false / empty (each matters only beside another setting).
  static const std::map<std::string, nlohmann::json> kDefaults = {{"megatron_core", "megatron.core"},
                                                                  {"qalora_group_size", 16}};
  static const std::map<std::string, std::string> kWhat = {
      {"alpha_pattern", "per-module lora_alpha"},        {"rank_pattern", "per-module ranks"},
      {"layers_to_transform", "adapters on some layers only"}, {"layers_pattern", "adapters on some layers only"},
      {"exclude_modules", "excluded modules"},           {"use_dora", "DoRA (weight-decomposed LoRA)"},
      {"fan_in_fan_out", "transposed (Conv1D) weights"}, {"lora_bias", "a bias on lora_B"},
      {"use_qalora", "QA-LoRA"},                         {"target_parameters", "adapters on parameters"},
      {"megatron_config", "Megatron-parallel layers"},   {"layer_replication", "replicated layers"},
      {"trainable_token_indices", "trainable token rows"}, {"alora_invocation_tokens", "activated LoRA"},
      {"arrow_config", "Arrow routing"},                 {"use_bdlora", "block-diagonal LoRA"},
      {"monteclora_config", "MonteCLoRA"},               {"loftq_config", "LoftQ (a base changed at init)"},
      {"ensure_weight_tying", "tied adapters"},
  };
  auto unset = [](const nlohmann::json& v) {
    return v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty()) ||
           (v.is_string() && v.get<std::string>().empty());
  };
  for (const auto& [key, value] : adapter_config.items()) {
    if (kImplemented.count(key) || kDescriptive.count(key) || unset(value)) continue;
    if (const auto it = kDefaults.find(key); it != kDefaults.end() && value == it->second) continue;
    const auto what = kWhat.find(key);
    fail(where, ": ", key, " is ", value.dump(), "; ", what != kWhat.end() ? what->second : "this peft setting",
         " is not implemented here (refused rather than imported as plain LoRA)");
  }
  // PiSSA, OLoRA, CorDA, EVA, ... initialise by changing the base weights: the adapter is not over the base.
  const auto& init = adapter_config.contains("init_lora_weights") ? adapter_config["init_lora_weights"] : nlohmann::json(true);
  if (!(init.is_boolean() || init == "gaussian"))
    fail(where, ": init_lora_weights is ", init.dump(), "; only true, false and \"gaussian\" leave the base weights as ",
         "they are (the others change them at init, so the adapter needs that changed base)");
  if (adapter_config.contains("bias") && adapter_config["bias"] != "none")
    fail(where, ": bias is ", adapter_config["bias"].dump(), "; only \"none\" is implemented (trained biases are not ",
         "in a LoRA run)");
  const auto& targets = adapter_config.contains("target_modules") ? adapter_config["target_modules"] : nlohmann::json();
  bool targets_ok = targets.is_string() || targets.is_array();
  if (targets.is_array())
    for (const auto& t : targets) targets_ok = targets_ok && t.is_string();
  if (!targets_ok) fail(where, ": target_modules is ", targets.dump(), ", expected a list of names or a regex string");
  const auto& saved = adapter_config.contains("modules_to_save") ? adapter_config["modules_to_save"] : nlohmann::json();
  bool saved_ok = saved.is_null() || saved.is_array();
  if (saved.is_array())
    for (const auto& m : saved) saved_ok = saved_ok && m.is_string();
  if (!saved_ok) fail(where, ": modules_to_save is ", saved.dump(), ", expected null or a list of names");
}

}  // namespace

void convert_lora_to_peft(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                          const std::string& base_model_name, const std::string& base_dir, bool overwrite, bool ema) {
  const std::string command = "lora-to-peft";
  ConversionOutput output(save_dir, overwrite, command);
  auto ckpt = open_lora_checkpoint(model_id, load_dir, command, ema);
  if (!base_dir.empty()) open_lora_base(ckpt, base_dir, command);  // a moved base: checked, then named below
  const auto& lora = ckpt.config.features.lora;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, linear] : ckpt.adapted) {
    if (linear->experts() != 1)
      fail(command, ": '", name, "' holds ", linear->experts(), " modality experts, which a PEFT LoRA layer cannot ",
           "express; write the merged weights instead (convert ", model_id, " merge-lora)");
    if (ckpt.hf->layout_differs(name + ".weight"))
      fail(command, ": '", name, "' has another row layout in HF than in training; its adapter has no PEFT form here");
    const std::string prefix = "base_model.model." + hf_module(*ckpt.hf, name);
    for (const char* part : {"lora_A", "lora_B"})
      tensors.emplace_back(prefix + "." + part + ".weight",
                           ckpt.trained(name + "." + part + ".weight").contiguous());
  }
  std::vector<std::string> saved_modules;
  for (auto& [module_name, module] : ckpt.model->named_modules())
    for (const auto& pattern : lora.modules_to_save)
      if (ModulePattern(pattern).matches(module_name)) saved_modules.push_back(module_name);
  for (const auto& module_name : saved_modules)
    for (auto& [name, param] : ckpt.model->named_parameters())
      if (name.rfind(module_name + ".", 0) == 0 && param->trainable) {
        if (ckpt.hf->layout_differs(name)) fail(command, ": modules_to_save '", name, "' has another row layout in HF");
        // The trained fp32 values: peft copies them into the module's own dtype when it loads.
        tensors.emplace_back("base_model.model." + ckpt.hf->hf_key(name),
                             ckpt.trained(name).contiguous());
      }
  safetensors_write((fs::path(output.staging()) / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});

  std::vector<std::string> hf_saved;
  for (const auto& m : saved_modules) hf_saved.push_back(hf_module(*ckpt.hf, m));
  const std::string base_name = !base_model_name.empty() ? base_model_name
                                : !base_dir.empty()      ? base_dir
                                                         : ckpt.base.value("weights", std::string());
  const auto& task_type = model_spec(model_id, command).peft_task_type;
  const nlohmann::json adapter_config = {
      {"peft_type", "LORA"},
      {"task_type", task_type.empty() ? nlohmann::json(nullptr) : nlohmann::json(task_type)},
      {"base_model_name_or_path", base_name},
      {"r", lora.rank},
      {"lora_alpha", lora.alpha},
      {"lora_dropout", lora.dropout},
      {"use_rslora", lora.use_rslora},
      {"target_modules", peft_target_modules(*ckpt.model, *ckpt.hf, ckpt.adapted)},
      {"modules_to_save", hf_saved.empty() ? nlohmann::json(nullptr) : nlohmann::json(hf_saved)},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"init_lora_weights", lora.init == "gaussian" ? nlohmann::json("gaussian") : nlohmann::json(true)},
      {"inference_mode", true},
      {"use_dora", false},
  };
  write_text(fs::path(output.staging()) / "adapter_config.json", adapter_config.dump(2) + "\n");
  output.commit();
  std::printf("%s: %s -> %s (%zu adapted layers, r %lld, lora_alpha %g%s, %zu tensors)\n", command.c_str(),
              ckpt.reader->dir().c_str(), save_dir.c_str(), ckpt.adapted.size(), static_cast<long long>(lora.rank),
              lora.alpha, lora.use_rslora ? ", rsLoRA" : "", tensors.size());
}

void convert_peft_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& peft_dir,
                          const std::string& save_dir, int world_size, bool overwrite) {
  const std::string command = "peft-to-ckpt";
  const Config config = config_load(config_path);
  if (config.model.model_id != model_id)
    fail(command, ": ", config_path, " builds model '", config.model.model_id, "', not '", model_id, "'");
  if (!config.features.enable_lora)
    fail(command, ": ", config_path, " has features.enable_lora off; the adapter continues a LoRA run");
  const auto& lora = config.features.lora;
  const fs::path dir(peft_dir);
  const std::string config_file = (dir / "adapter_config.json").string();
  const std::string where = command + ": " + config_file;
  const auto adapter_config = json_parse_checked(read_user_file(config_file, "adapter_config.json", kMaxSmallJsonBytes), where);
  if (!adapter_config.is_object()) fail(where, ": expected a JSON object");
  if (json_string(adapter_config, "peft_type", where) != "LORA")
    fail(where, ": peft_type is '", json_string(adapter_config, "peft_type", where), "', only LORA adapters are read");
  const auto& r = adapter_config.contains("r") ? adapter_config["r"] : nlohmann::json();
  if (!r.is_number_integer() || r.get<int64_t>() != lora.rank)
    fail(where, ": r is ", r.dump(), ", features.lora.rank in ", config_path, " is ", lora.rank);
  if (json_finite(adapter_config, "lora_alpha", where) != lora.alpha)
    fail(where, ": lora_alpha is ", adapter_config["lora_alpha"].dump(), ", features.lora.alpha is ", lora.alpha);
  const auto rslora = adapter_config.value("use_rslora", nlohmann::json(false));
  if (!rslora.is_boolean() || rslora.get<bool>() != lora.use_rslora)
    fail(where, ": use_rslora is ", rslora.dump(), ", features.lora.use_rslora is ", lora.use_rslora ? "true" : "false");
  refuse_unimplemented_peft_fields(adapter_config, where);
  ConversionOutput output(save_dir, overwrite, command);
  const ModelSpec& spec = model_spec(model_id, command);
  auto model = spec.build(config.model.config);
  const auto summary = apply_lora(*model, lora, spec.lora_default_targets, spec.lora_supported_targets);
  const auto hf = make_hf_adapter(spec, config.model.config);
  const SafetensorsFile file((dir / "adapter_model.safetensors").string());
  // Every trained param by its key in the adapter file; the file holds exactly these.
  std::map<std::string, std::pair<std::string, Param*>> by_key;  // peft key -> (name, param)
  const auto adapted = adapted_linears(*model, summary);
  for (auto& [name, param] : model->named_parameters()) {
    if (!param->trainable || !param->requires_grad) continue;
    const std::string module = name.substr(0, name.rfind('.'));
    const std::string owner = module.substr(0, module.rfind('.'));  // the adapted Linear of a lora_A / lora_B
    const std::string key = param->adapter_dtype
                                ? "base_model.model." + hf_module(*hf, owner) + name.substr(owner.size())
                                : "base_model.model." + hf->hf_key(name);
    if (param->adapter_dtype && !adapted.count(owner)) fail(command, ": internal: '", name, "' has no adapted layer");
    // The two directions agree: what lora-to-peft refuses to write is refused when read.
    const std::string layer = param->adapter_dtype ? owner : name.substr(0, name.rfind('.'));
    if (param->adapter_dtype && adapted.at(owner)->experts() != 1)
      fail(command, ": '", owner, "' holds ", adapted.at(owner)->experts(), " modality experts, which a PEFT LoRA ",
           "layer cannot express; lora-to-peft writes no such adapter either");
    if (hf->layout_differs(param->adapter_dtype ? owner + ".weight" : name))
      fail(command, ": '", layer, "' has another row layout in HF than in training; its adapter has no PEFT form here ",
           "(lora-to-peft refuses it too)");
    by_key[key] = {name, param};
  }
  for (const auto& key : file.names())
    if (!by_key.count(key))
      fail(command, ": ", file.path(), " holds '", key, "', which the model of ", config_path,
           " does not train (another target_modules or modules_to_save, or another model)");
  std::vector<ShardedTensor> tensors;
  for (const auto& [key, entry] : by_key) {
    const auto& [name, param] = entry;
    if (!file.contains(key))
      fail(command, ": ", file.path(), " has no '", key, "', which ", config_path, "'s features.lora trains");
    if (file.info(key).shape != param->shape)
      fail(command, ": ", file.path(), ": '", key, "' has shape ", at::IntArrayRef(file.info(key).shape),
           ", the model's '", name, "' is ", at::IntArrayRef(param->shape));
    if (!at::isFloatingType(file.info(key).dtype))
      fail(command, ": ", file.path(), ": '", key, "' is ", c10::toString(file.info(key).dtype),
           "; adapter and trained weights must be floating point");
    const at::Tensor value = file.read(key);
    if (const int64_t bad = first_non_finite(value); bad >= 0)
      fail(command, ": ", file.path(), ": '", key, "' holds ", value.reshape(-1)[bad].item<double>(), " (element ", bad,
           "); a checkpoint never holds non-finite weights");
    tensors.push_back({state_model_key(name), param->shape, 0, value.to(at::kFloat).contiguous(), nullptr});
    for (const auto& moment : {state_exp_avg_key(name), state_exp_avg_sq_key(name)})  // a fresh AdamW's
      tensors.push_back({moment, param->shape, 0, at::zeros(param->shape, at::kFloat), nullptr});
  }
  for (auto& [name, param] : model->named_parameters())
    if (!param->trainable) tensors.push_back({state_model_key(name), param->shape, 0, param->init_value(), nullptr});
  StateInfo info;
  info.iteration = 0;
  info.global_batch_size = config_global_batch(config, parallel_dims(config.parallel, world_size, command + ": " + config_path + ": "));
  info.model_id = model_id;
  info.config = config_to_json(config);
  info.extra = {{"source", peft_dir}};
  info.plan = state_plan_entry(FsdpConfig{});
  info.plan["converted_from"] = "peft";
  info.lora_base = lora_base(config);
  Comm comm(nullptr, 0, 1);
  const auto written = checkpoint_save(output.staging(), 0, comm, tensors, state_global_state(info, int64_t{0}),
                                       state_rank_state(), info.plan);
  output.commit();
  std::printf("%s: %s -> %s (%zu tensors, adapters over %s; training.load: it continues training from them)\n",
              command.c_str(), peft_dir.c_str(), (fs::path(save_dir) / fs::path(written).filename()).c_str(),
              by_key.size(), info.lora_base.dump().c_str());
}

void convert_merge_lora(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                        const std::string& dtype, const std::string& base_dir, bool overwrite, bool ema) {
  const std::string command = "merge-lora";
  if (dtype != "public" && dtype != "fp32") fail(command, ": --dtype must be public or fp32, found '", dtype, "'");
  ConversionOutput output(save_dir, overwrite, command);
  auto ckpt = open_lora_checkpoint(model_id, load_dir, command, ema);
  // The base: the run's model weights (checked against the fingerprint the adapters were trained
  // over) or its random init.
  const std::unique_ptr<WeightSource> source = open_lora_base(ckpt, base_dir, command);
  const uint64_t seed = ckpt.base.value("init_seed", uint64_t{0});
  // The base's own key for each HF key (a legacy alias where it uses one); the output keeps them.
  std::map<std::string, std::string> key_in_base;
  if (source)
    for (auto& [name, param] : ckpt.model->named_parameters()) {
      if (param->adapter_dtype) continue;
      const auto key = source_key_of(*source, *ckpt.hf, name);
      if (key.empty()) fail(command, ": the base ", source->path(), " has no tensor for '", ckpt.hf->hf_key(name), "'");
      key_in_base[ckpt.hf->hf_key(name)] = key;
    }
  auto base_key = [&](const std::string& hf_key) { return source ? key_in_base.at(hf_key) : hf_key; };
  auto read_hf = [&](const std::string& key, int64_t b, int64_t e) { return source->read_rows(base_key(key), b, e); };
  auto out_dtype = [&dtype](const Param& param) { return dtype == "fp32" ? at::kFloat : param.checkpoint_dtype; };
  // One merged tensor in memory at a time: each is computed when the writer reaches it.
  auto merged = [&, seed](const std::string& name, Param* param) {
    const int64_t rows = param->shape.empty() ? 1 : param->shape[0];
    // A weight the run trained over quantized (features.lora.base_quant) is merged as the run saw it:
    // dequantized, as peft's merge onto bitsandbytes' dequantized weights. A quantized base's read
    // gives that already; an unquantized base's HF tensor is quantized and dequantized here, as the
    // run's loader does (train/hf_weights.cpp).
    const bool dequantized_here = !param->requires_grad && param->base_quant != quant::BaseQuant::none &&
                                  !(source && source->quantization(base_key(ckpt.hf->hf_key(name))) != quant::BaseQuant::none);
    auto read_as_trained = [&](const std::string& key, int64_t b, int64_t e) {
      if (!dequantized_here) return read_hf(key, b, e);
      const at::Tensor whole = source->read_full(base_key(key));
      return quant::dequantize_weight(quant::quantize_weight(whole, param->base_quant), whole.scalar_type()).narrow(0, b, e - b);
    };
    at::Tensor full;
    if (!param->trainable)
      full = source ? read_as_trained(ckpt.hf->hf_key(name), 0, rows) : param->init_value();
    else if (param->requires_grad)  // modules_to_save: trained in full, in the checkpoint
      full = ckpt.trained(name);
    else
      full = source ? ckpt.hf->load_rows(name, 0, rows, read_as_trained) : param_init_rows(*param, name, seed, 0, rows);
    if (dequantized_here && !source)  // a random init, quantized as the run's loader quantizes it
      full = quant::dequantize_weight(quant::quantize_weight(full, param->base_quant), full.scalar_type());
    full = full.to(at::kFloat);
    const std::string module = name.substr(0, name.rfind('.'));
    if (auto it = ckpt.adapted.find(module); it != ckpt.adapted.end() && name == module + ".weight") {
      const Linear& linear = *it->second;
      const int64_t e = linear.experts();
      const auto a = ckpt.trained(module + ".lora_A.weight").to(at::kFloat);
      const auto b = ckpt.trained(module + ".lora_B.weight").to(at::kFloat);
      std::vector<at::Tensor> delta;  // W_k += scale * B_k A_k, expert by expert
      for (int64_t k = 0; k < e; ++k) delta.push_back(at::mm(b.chunk(e, 0)[k], a.chunk(e, 0)[k]));
      full = full + at::cat(delta, 0) * linear.lora_scale;
    }
    return ckpt.hf->to_hf_layout(name, full).to(out_dtype(*param)).contiguous();
  };
  std::vector<SafetensorsSource> tensors;
  int64_t conversions = 0;
  for (auto& [name, param] : ckpt.model->named_parameters()) {
    if (param->adapter_dtype) continue;
    if (ckpt.hf->layout_differs(name)) ++conversions;
    tensors.push_back({base_key(ckpt.hf->hf_key(name)), out_dtype(*param), param->shape,
                       [&merged, name = name, param = param] { return merged(name, param); }});
  }
  if (conversions != ckpt.hf->expected_layout_conversions())
    fail(command, ": restores the layout of ", conversions, " tensors, the config expects ",
         ckpt.hf->expected_layout_conversions());
  safetensors_write_streamed((fs::path(output.staging()) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  // The merged weights are plain: a quantized base's quantization_config would make transformers
  // wrap them in its quantized layers.
  if (source && fs::is_directory(source->path()))
    copy_base_files(source->path(), output.staging(), command,
                    {.edit_config = [&](const std::string& text) { return config_without_quantization(text, command); }});
  output.commit();
  std::printf("%s: %s -> %s/model.safetensors (%zu tensors, %zu adapted layers merged)\n", command.c_str(),
              ckpt.reader->dir().c_str(), save_dir.c_str(), tensors.size(), ckpt.adapted.size());
}

}  // namespace mmtrain
