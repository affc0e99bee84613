// The MagiHuman spec: what the tools and the trainer know of model_id "magihuman".
#include "core/error.h"
#include "core/text.h"
#include "io/safetensors.h"
#include "models/magihuman/flops.h"
#include "models/magihuman/hf_adapter.h"
#include "models/magihuman/memory.h"
#include "models/magihuman/model.h"
#include "models/model_spec.h"
#include "quant/quantized_weight.h"

#include <cmath>
#include <map>

namespace mmtrain::magihuman {
namespace {

// Shapes from the headers of the directory's safetensors files (a quantized weight's from its
// quant_state); no weight data is read.
nlohmann::json config_from_checkpoint(const std::string& hf_dir) {
  SafetensorsIndex index(hf_dir);
  const quant::CheckpointView view = quant::checkpoint_view(
      index.names(), [&](const std::string& key) { return index.contains(key); },
      [&](const std::string& key) { return index.read(key); },
      [&](const std::string& key) { return index.info(key).shape; }, hf_dir);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& name : view.names)
    shapes[name] = view.forms.count(name) ? view.forms.at(name).shape : index.info(name).shape;
  return MagiHumanConfig::infer_from_shapes(shapes).to_json();
}

// The seed's calculator (MindSpeed-MM flops_magihuman.py): 6 N tokens + c s² hd heads layers.
FlopsReport flops(const nlohmann::json& model_config, const FlopsQuery& q) {
  const auto c = MagiHumanConfig::from_json(model_config);
  const double coefficient = q.attention_coefficient.value_or(kSeedAttentionCoefficient);
  if (coefficient < 0) fail("flops magihuman: --attention-coefficient must be >= 0, found ", coefficient);
  if (!q.images.empty()) fail("flops magihuman: --images is for image-text models; MagiHuman reads latents");
  const double active = magihuman_active_linear_params(c);
  const auto t = magihuman_throughput(active, c, q.seqlens, 1, 1, 0, 0, coefficient);
  int64_t tokens = 0;
  for (int64_t s : q.seqlens) tokens += s;

  FlopsReport r;
  r.title = "MagiHuman FLOPs (MindSpeed-MM flops_magihuman.py convention; docs/flops.md)";
  r.lines = {
      format("model                  %lld layers, hidden %lld, %lld q / %lld kv heads x %lld, mm_layers [%s]",
             static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
             static_cast<long long>(c.num_heads_q()), static_cast<long long>(c.num_query_groups),
             static_cast<long long>(c.head_dim), join_ints(c.mm_layers).c_str()),
      format("active linear params   %s (%.3fB; 2-D tensors, mm_layers / %d)",
             with_commas(std::llround(active)).c_str(), active / 1e9, kNumModalities),
      format("samples                %lld, seqlens [%s], %lld tokens", static_cast<long long>(t.samples),
             join_ints(q.seqlens).c_str(), static_cast<long long>(tokens)),
      format("linear term            %.4e FLOPs per sample (6 * N * tokens)", t.linear_flops_per_sample),
      format("attention term         %.4e FLOPs per sample (%g * s^2 * head_dim * heads * layers; full "
             "bidirectional attention costs ~2x the seed's 7)",
             t.attention_flops_per_sample, t.attention_coefficient),
  };
  r.fields = {{"active_linear_params", static_cast<int64_t>(std::llround(active))},
              {"attention_coefficient", t.attention_coefficient},
              {"samples", t.samples},
              {"linear_flops_per_sample", t.linear_flops_per_sample},
              {"attention_flops_per_sample", t.attention_flops_per_sample}};
  r.flops_per_sample = t.flops_per_sample;
  r.attention_flops_per_sample = t.attention_flops_per_sample;
  return r;
}

ModelSpec magihuman_spec() {
  ModelSpec spec;
  spec.name = "magihuman";
  spec.title = "MagiHuman DiT";
  spec.converter_alias = "MagiHumanConverter";
  spec.dpo_form = "flow";
  spec.build = [](const nlohmann::json& j) { return make_magihuman(MagiHumanConfig::from_json(j)); };
  spec.hf_adapter = [](const nlohmann::json& j) {
    return std::make_shared<MagiHumanHfAdapter>(MagiHumanConfig::from_json(j));
  };
  spec.config_from_checkpoint = config_from_checkpoint;
  spec.flops = flops;
  spec.activations = [](const ActivationQuery& q) {
    return magihuman_activation_estimate(MagiHumanConfig::from_json(q.model_config), q.seqlen * q.micro_batch_size,
                                         static_cast<int64_t>(c10::elementSize(q.param_dtype)));
  };
  spec.execution_only_keys = {"fused_ops"};
  // DiffSynth / VeOmni's attention projections; every expert of a layer gets its own pair.
  spec.lora_default_targets = {"dit.block.layers.{*}.attention.linear_qkv", "dit.block.layers.{*}.attention.linear_proj"};
  spec.lora_supported_targets = {"dit.block.layers.{*}.attention.linear_qkv", "dit.block.layers.{*}.attention.linear_proj",
                                 "dit.block.layers.{*}.mlp.up_gate_proj", "dit.block.layers.{*}.mlp.down_proj"};
  spec.default_seqlen = 4606;  // the seed's 256x480, 5 s sample: 3840 video + 126 audio + 640 text tokens
  return spec;
}

const ModelSpecRegistration registration(magihuman_spec());

}  // namespace
}  // namespace mmtrain::magihuman
