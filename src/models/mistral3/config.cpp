#include "models/mistral3/config.h"

#include "core/error.h"
#include "models/config_check.h"

#include <algorithm>
#include <vector>

namespace mmtrain::mistral3 {
namespace {

// HF config.json keys that carry no math for training (ids, metadata, inference switches).
const std::vector<std::string> kIgnored = {
    "model_type", "architectures", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "max_position_embeddings", "attention_dropout", "initializer_range", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict", "_name_or_path", "id2label", "label2id",
    "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "_attn_implementation_autoset",
    "text_config_dict", "vision_config_dict", "layer_types"};

class Reader {
 public:
  Reader(const nlohmann::json& j, std::string where, std::vector<std::string> known)
      : j_(j), where_(std::move(where)), known_(std::move(known)) {
    if (!j_.is_object()) fail(where_, ": expected a mapping, got ", j_.dump());
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (std::find(known_.begin(), known_.end(), it.key()) == known_.end() &&
          std::find(kIgnored.begin(), kIgnored.end(), it.key()) == kIgnored.end())
        fail(where_, ": unknown key '", it.key(), "' for mistral3");
  }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  template <typename T>
  void get(const char* key, T& field) const {
    if (!has(key)) return;
    try {
      field = j_.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(where_, ".", key, ": wrong type (", j_.at(key).dump(), ")");
    }
  }
  const nlohmann::json& at(const char* key) const { return j_.at(key); }
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::vector<std::string> known_;
};

// rope_theta, or rope_parameters {rope_theta, rope_type}; any scaling is refused.
void read_rope(const Reader& r, const std::string& allowed_type, double& theta) {
  r.get("rope_theta", theta);
  if (r.has("rope_scaling")) fail(r.where(), ".rope_scaling: RoPE scaling is not supported (default RoPE only)");
  if (!r.has("rope_parameters")) return;
  const auto& p = r.at("rope_parameters");
  if (!p.is_object()) fail(r.where(), ".rope_parameters: expected a mapping");
  for (auto it = p.begin(); it != p.end(); ++it) {
    if (it.key() == "rope_theta") {
      theta = it.value().get<double>();
    } else if (it.key() == "rope_type") {
      const auto type = it.value().get<std::string>();
      if (type != allowed_type && type != "default")
        fail(r.where(), ".rope_parameters.rope_type: '", type, "' is not supported (", allowed_type, " only)");
    } else {
      fail(r.where(), ".rope_parameters: unsupported key '", it.key(), "'");
    }
  }
}

}  // namespace

Mistral3Config Mistral3Config::from_json(const nlohmann::json& j) {
  Mistral3Config c;
  Reader top(j, "model.config",
             {"text_config", "vision_config", "image_token_index", "image_token_id", "spatial_merge_size",
              "projector_hidden_act", "multimodal_projector_bias", "vision_feature_layer", "tie_word_embeddings",
              "freeze_vision", "loss_chunk_size"});
  top.get("image_token_index", c.image_token_index);
  top.get("image_token_id", c.image_token_index);
  top.get("spatial_merge_size", c.spatial_merge_size);
  top.get("freeze_vision", c.freeze_vision);
  top.get("loss_chunk_size", c.loss_chunk_size);
  if (c.loss_chunk_size < 0) fail("model.config.loss_chunk_size: expected >= 0 (0 = whole logits), got ", c.loss_chunk_size);
  std::string act = "gelu";
  top.get("projector_hidden_act", act);
  if (act != "gelu") fail("model.config.projector_hidden_act: only 'gelu' (exact) is supported, got '", act, "'");
  bool flag = false;
  top.get("multimodal_projector_bias", flag);
  if (flag) fail("model.config.multimodal_projector_bias: true is not supported (Magistral has no biases)");
  flag = false;
  top.get("tie_word_embeddings", flag);
  if (flag) fail("model.config.tie_word_embeddings: true is not supported; Magistral's lm_head is untied");
  int64_t feature_layer = -1;
  top.get("vision_feature_layer", feature_layer);
  if (feature_layer != -1) fail("model.config.vision_feature_layer: only -1 (last layer) is supported, got ", feature_layer);

  if (!top.has("text_config")) fail("model.config.text_config is required for mistral3");
  Reader t(top.at("text_config"), "model.config.text_config",
           {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling", "hidden_act",
            "tie_word_embeddings", "attention_bias", "mlp_bias", "sliding_window"});
  t.get("vocab_size", c.vocab_size);
  t.get("hidden_size", c.hidden_size);
  t.get("num_hidden_layers", c.num_layers);
  t.get("num_attention_heads", c.num_heads);
  t.get("num_key_value_heads", c.num_kv_heads);
  require_at_least("text_config.vocab_size", c.vocab_size);
  require_at_least("text_config.hidden_size", c.hidden_size);
  require_at_least("text_config.num_attention_heads", c.num_heads);
  require_at_least("text_config.num_key_value_heads", c.num_kv_heads);
  c.head_dim = c.hidden_size / c.num_heads;  // HF's default when head_dim is absent
  t.get("head_dim", c.head_dim);
  t.get("intermediate_size", c.intermediate_size);
  t.get("rms_norm_eps", c.rms_norm_eps);
  read_rope(t, "default", c.rope_theta);
  if (t.has("sliding_window"))
    fail("model.config.text_config.sliding_window: only null (full causal attention) is supported, got ",
         t.at("sliding_window").dump());
  std::string text_act = "silu";
  t.get("hidden_act", text_act);
  if (text_act != "silu") fail("model.config.text_config.hidden_act: only 'silu' is supported, got '", text_act, "'");
  for (const char* key : {"tie_word_embeddings", "attention_bias", "mlp_bias"}) {
    flag = false;
    t.get(key, flag);
    if (flag) fail("model.config.text_config.", key, ": true is not supported");
  }

  if (!top.has("vision_config")) fail("model.config.vision_config is required for mistral3");
  Reader v(top.at("vision_config"), "model.config.vision_config",
           {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "patch_size", "image_size",
            "num_channels", "hidden_act", "rope_theta", "rope_parameters", "rope_scaling", "head_dim"});
  v.get("hidden_size", c.vision_hidden_size);
  v.get("num_hidden_layers", c.vision_num_layers);
  v.get("num_attention_heads", c.vision_num_heads);
  v.get("intermediate_size", c.vision_intermediate_size);
  v.get("patch_size", c.patch_size);
  v.get("image_size", c.image_size);
  v.get("num_channels", c.num_channels);
  c.vision_act = "gelu";  // PixtralVisionConfig's class default; Magistral's config says silu
  v.get("hidden_act", c.vision_act);
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

}  // namespace mmtrain::mistral3
