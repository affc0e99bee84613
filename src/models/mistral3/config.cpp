#include "models/mistral3/config.h"

#include "core/error.h"
#include "core/param_map.h"
#include "models/config_check.h"

#include <algorithm>
#include <vector>

namespace mmtrain::mistral3 {
namespace {

// HF config.json keys that carry no math for training (ids, metadata, inference switches; a
// quantization_config describes how the weights are stored, which the loader reads off the tensors
// themselves: train/hf_weights.h).
const std::vector<std::string> kIgnored = {
    "model_type", "architectures", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "max_position_embeddings", "attention_dropout", "initializer_range", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict", "_name_or_path", "id2label", "label2id",
    "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "_attn_implementation_autoset",
    "text_config_dict", "vision_config_dict", "layer_types", "quantization_config"};

// A section of the config that refuses keys outside known (and the ignored ones).
ParamMap section(const nlohmann::json& j, const std::string& where, std::vector<std::string> known) {
  ParamMap m(j, where, "mistral3");
  known.insert(known.end(), kIgnored.begin(), kIgnored.end());
  m.check_known_keys(known);
  return m;
}

// rope_theta, or rope_parameters {rope_theta, rope_type}; any scaling is refused.
void read_rope(const ParamMap& m, const std::string& allowed_type, double& theta) {
  theta = m.get_double("rope_theta", theta);
  if (m.has("rope_scaling")) fail(m.where("rope_scaling"), ": RoPE scaling is not supported (default RoPE only)");
  if (!m.has("rope_parameters")) return;
  const ParamMap p = m.child("rope_parameters");
  p.check_known_keys({"rope_theta", "rope_type"});
  theta = p.get_double("rope_theta", theta);
  const std::string type = p.get_string("rope_type", "default");
  if (type != allowed_type && type != "default")
    fail(p.where("rope_type"), ": '", type, "' is not supported (", allowed_type, " only)");
}

// A switch mmtrain implements only in its default state (false).
void refuse_true(const ParamMap& m, const std::string& key, const std::string& why) {
  if (m.get_bool(key, false)) fail(m.where(key), ": true is not supported", why);
}

}  // namespace

Mistral3Config Mistral3Config::from_json(const nlohmann::json& j) {
  Mistral3Config c;
  const ParamMap top = section(j, "model.config",
                               {"text_config", "vision_config", "image_token_index", "image_token_id",
                                "spatial_merge_size", "projector_hidden_act", "multimodal_projector_bias",
                                "vision_feature_layer", "tie_word_embeddings", "freeze_vision", "loss_chunk_size"});
  c.image_token_index = top.get_int("image_token_index", c.image_token_index);
  c.image_token_index = top.get_int("image_token_id", c.image_token_index);
  c.spatial_merge_size = top.get_int("spatial_merge_size", c.spatial_merge_size);
  c.freeze_vision = top.get_bool("freeze_vision", c.freeze_vision);
  c.loss_chunk_size = top.get_int("loss_chunk_size", c.loss_chunk_size);
  if (c.loss_chunk_size < 0) fail("model.config.loss_chunk_size: expected >= 0 (0 = whole logits), got ", c.loss_chunk_size);
  const std::string act = top.get_string("projector_hidden_act", "gelu");
  if (act != "gelu") fail("model.config.projector_hidden_act: only 'gelu' (exact) is supported, got '", act, "'");
  refuse_true(top, "multimodal_projector_bias", " (Magistral has no biases)");
  refuse_true(top, "tie_word_embeddings", "; Magistral's lm_head is untied");
  const int64_t feature_layer = top.get_int("vision_feature_layer", -1);
  if (feature_layer != -1) fail("model.config.vision_feature_layer: only -1 (last layer) is supported, got ", feature_layer);

  if (!top.has("text_config")) fail("model.config.text_config is required for mistral3");
  const ParamMap t = section(top.child("text_config").raw(), "model.config.text_config",
                             {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                              "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
                              "rope_parameters", "rope_scaling", "hidden_act", "tie_word_embeddings", "attention_bias",
                              "mlp_bias", "sliding_window"});
  c.vocab_size = t.get_int("vocab_size", c.vocab_size);
  c.hidden_size = t.get_int("hidden_size", c.hidden_size);
  c.num_layers = t.get_int("num_hidden_layers", c.num_layers);
  c.num_heads = t.get_int("num_attention_heads", c.num_heads);
  c.num_kv_heads = t.get_int("num_key_value_heads", c.num_kv_heads);
  require_at_least("text_config.vocab_size", c.vocab_size);
  require_at_least("text_config.hidden_size", c.hidden_size);
  require_at_least("text_config.num_attention_heads", c.num_heads);
  require_at_least("text_config.num_key_value_heads", c.num_kv_heads);
  c.head_dim = t.get_int("head_dim", c.hidden_size / c.num_heads);  // HF's default when head_dim is absent
  c.intermediate_size = t.get_int("intermediate_size", c.intermediate_size);
  c.rms_norm_eps = t.get_double("rms_norm_eps", c.rms_norm_eps);
  read_rope(t, "default", c.rope_theta);
  if (t.has("sliding_window"))
    fail("model.config.text_config.sliding_window: only null (full causal attention) is supported, got ",
         t.raw().at("sliding_window").dump());
  const std::string text_act = t.get_string("hidden_act", "silu");
  if (text_act != "silu") fail("model.config.text_config.hidden_act: only 'silu' is supported, got '", text_act, "'");
  for (const char* key : {"tie_word_embeddings", "attention_bias", "mlp_bias"}) refuse_true(t, key, "");

  if (!top.has("vision_config")) fail("model.config.vision_config is required for mistral3");
  const ParamMap v = section(top.child("vision_config").raw(), "model.config.vision_config",
                             {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                              "patch_size", "image_size", "num_channels", "hidden_act", "rope_theta",
                              "rope_parameters", "rope_scaling", "head_dim"});
  c.vision_hidden_size = v.get_int("hidden_size", c.vision_hidden_size);
  c.vision_num_layers = v.get_int("num_hidden_layers", c.vision_num_layers);
  c.vision_num_heads = v.get_int("num_attention_heads", c.vision_num_heads);
  c.vision_intermediate_size = v.get_int("intermediate_size", c.vision_intermediate_size);
  c.patch_size = v.get_int("patch_size", c.patch_size);
  c.image_size = v.get_int("image_size", c.image_size);
  c.num_channels = v.get_int("num_channels", c.num_channels);
  // PixtralVisionConfig's class default is gelu; Magistral's config says silu.
  c.vision_act = v.get_string("hidden_act", "gelu");
  if (c.vision_act != "silu" && c.vision_act != "gelu")
    fail("model.config.vision_config.hidden_act: 'silu' or 'gelu' expected, got '", c.vision_act, "'");
  read_rope(v, "axial", c.vision_rope_theta);

  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"text_config.num_hidden_layers", c.num_layers},
                                   {"text_config.head_dim", c.head_dim},
                                   {"text_config.intermediate_size", c.intermediate_size},
                                   {"vision_config.hidden_size", c.vision_hidden_size},
                                   {"vision_config.num_hidden_layers", c.vision_num_layers},
                                   {"vision_config.num_attention_heads", c.vision_num_heads},
                                   {"vision_config.intermediate_size", c.vision_intermediate_size},
                                   {"vision_config.patch_size", c.patch_size},
                                   {"vision_config.image_size", c.image_size},
                                   {"vision_config.num_channels", c.num_channels},
                                   {"spatial_merge_size", c.spatial_merge_size}})
    require_at_least(key, value);
  if (c.head_dim % 2 != 0) fail("model.config.text_config.head_dim must be even (RoPE), got ", c.head_dim);
  if (c.num_heads % c.num_kv_heads != 0)
    fail("model.config.text_config: num_attention_heads ", c.num_heads, " is not a multiple of num_key_value_heads ",
         c.num_kv_heads);
  if (c.vision_hidden_size % c.vision_num_heads != 0 || c.vision_head_dim() % 4 != 0)
    fail("model.config.vision_config: hidden_size / num_attention_heads must be a multiple of 4 (2D RoPE), got ",
         c.vision_hidden_size, " / ", c.vision_num_heads);
  if (c.image_token_index < 0 || c.image_token_index >= c.vocab_size)
    fail("model.config.image_token_index ", c.image_token_index, " is outside the vocabulary (", c.vocab_size, ")");
  return c;
}

nlohmann::json Mistral3Config::to_hf_json() const {
  return {
      {"architectures", {"Mistral3ForConditionalGeneration"}},
      {"model_type", "mistral3"},
      {"image_token_index", image_token_index},
      {"spatial_merge_size", spatial_merge_size},
      {"projector_hidden_act", "gelu"},
      {"multimodal_projector_bias", false},
      {"vision_feature_layer", -1},
      {"tie_word_embeddings", false},
      {"text_config",
       {{"model_type", "mistral"},
        {"vocab_size", vocab_size},
        {"hidden_size", hidden_size},
        {"num_hidden_layers", num_layers},
        {"num_attention_heads", num_heads},
        {"num_key_value_heads", num_kv_heads},
        {"head_dim", head_dim},
        {"intermediate_size", intermediate_size},
        {"rms_norm_eps", rms_norm_eps},
        {"rope_theta", rope_theta},
        {"hidden_act", "silu"},
        {"sliding_window", nullptr},
        {"tie_word_embeddings", false}}},
      {"vision_config",
       {{"model_type", "pixtral"},
        {"hidden_size", vision_hidden_size},
        {"num_hidden_layers", vision_num_layers},
        {"num_attention_heads", vision_num_heads},
        {"head_dim", vision_head_dim()},
        {"intermediate_size", vision_intermediate_size},
        {"patch_size", patch_size},
        {"image_size", image_size},
        {"num_channels", num_channels},
        {"hidden_act", vision_act},
        {"rope_theta", vision_rope_theta}}},
  };
}

}  // namespace mmtrain::mistral3
