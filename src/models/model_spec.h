// ModelSpec: everything mmtrain knows about one model family, registered from the model's own
// folder (src/models/<name>/spec.cpp) and looked up by model.model_id. The trainer and the tools
// (convert, flops, plan, fixture, debug) iterate over specs and name no model, so a new model
// touches its own folder and nothing else (docs/adding_a_model.md).
//
// Tensor names, shapes and checkpoint dtypes are not part of the spec: they are the Module tree
// `build` returns (every Param is declared where the model creates it).
#pragma once
#include "core/registry.h"
#include "models/activation_estimate.h"
#include "models/flops_report.h"
#include "models/hf_adapter.h"
#include "models/model.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain {

// What a vision-language model tells the data pipeline about its images, so that a dataset never
// parses a model's config: the image processor (data/image/image_processor.h, by name) and the
// geometry it needs.
struct VisionInputs {
  std::string image_processor;   // "pixtral"
  int64_t patch_size = 0;        // pixels per patch side
  int64_t spatial_merge_size = 1;  // patches merged per token side
  int64_t image_size = 0;        // the longest side the vision tower takes
};

struct ModelSpec {
  std::string name;              // model.model_id, and the `convert` / `flops` / `fixture` subcommand
  std::string title;             // "MagiHuman DiT", for help texts
  std::string converter_alias;   // the seed's name of its converter ("MagiHumanConverter"); may be empty

  // The Module tree for model.config (the model checks its own keys). Parameters are shapes
  // only: nothing is allocated until FSDP shards them.
  std::function<std::shared_ptr<Model>(const nlohmann::json& model_config)> build;
  // The HF state-dict adapter for model.config; empty = the identity HfAdapter.
  std::function<std::shared_ptr<const HfAdapter>(const nlohmann::json& model_config)> hf_adapter;
  // model.config read off an HF checkpoint directory (its config.json or its tensor shapes;
  // headers only, no tensor data). Fails saying why when the directory does not describe the
  // model. Empty: `convert` and `flops --ckpt` need --config.
  std::function<nlohmann::json(const std::string& hf_dir)> config_from_checkpoint;
  // `mmtrain flops NAME`; empty: the model has no FLOPs tool.
  std::function<FlopsReport(const nlohmann::json& model_config, const FlopsQuery& query)> flops;
  // `mmtrain plan`'s activation estimate; empty: plan shows parameters and shards only.
  std::function<ActivationEstimate(const ActivationQuery& query)> activations;
  int64_t default_seqlen = 0;    // plan's tokens per sample when --seqlen is not given; 0 = required
  // The image inputs of a vision-language model; empty: the model takes no images.
  std::function<VisionInputs(const nlohmann::json& model_config)> vision_inputs;
  // model.config keys that change how the model computes, not what it is (fused kernels, chunk
  // sizes): a resume may change them. Every other key must equal the checkpoint's.
  std::vector<std::string> execution_only_keys;
  // LoRA (nn/lora.h): the Linear modules adapted when features.lora.target_modules is empty, and
  // the patterns of every Linear whose forward applies an adapter (a target outside them is
  // refused: the model computes it from the raw weight, and its adapter would never act).
  std::vector<std::string> lora_default_targets;
  std::vector<std::string> lora_supported_targets;
  // adapter_config.json's task_type for `lora-to-peft` ("CAUSAL_LM": peft builds a
  // PeftModelForCausalLM); empty: null (a plain PeftModel).
  std::string peft_task_type;
  // How training.objective dpo scores this model's preference pairs (train/objective.h):
  // "log_probs" (a language model: each answer's log-probability, models/model.h's
  // kSequenceLogProbsKey), "flow" (a flow-matching model: Flow-DPO over each clip's error,
  // kSampleTermLossesKey); empty: the model has no preference objective.
  std::string dpo_form;
  // The HF config.json of a model.config, every value the model uses written out (HF's class
  // defaults differ from the model's own: an absent rms_norm_eps is 1e-6 to transformers, 1e-5 to
  // Magistral): `fixture MODEL-weights` writes it beside the weights, so HF tools build exactly the
  // model the directory holds. Empty: the model has no such config.json.
  std::function<nlohmann::json(const nlohmann::json& model_config)> hf_config;
};

Registry<ModelSpec>& model_spec_registry();

// The spec of model_id; where (e.g. "config a.yaml: model.model_id") starts the message naming
// the known models when there is none.
const ModelSpec& model_spec(const std::string& model_id, const std::string& where = "");
// spec.hf_adapter(model_config), or the identity adapter.
std::shared_ptr<const HfAdapter> make_hf_adapter(const ModelSpec& spec, const nlohmann::json& model_config);

// Registers a spec at static initialisation, from the model's spec.cpp:
//   static const ModelSpecRegistration registration(magihuman_spec());
// (mmtrain's sources are an OBJECT library, so every registrar is linked and runs.)
struct ModelSpecRegistration {
  explicit ModelSpecRegistration(ModelSpec spec);
};

}  // namespace mmtrain
