#include "models/magihuman/config.h"

#include "core/error.h"

#include <algorithm>

namespace mmtrain::magihuman {

MagiHumanConfig MagiHumanConfig::from_json(const nlohmann::json& j) {
  MagiHumanConfig c;
  static const std::vector<std::string> known = {
      "num_layers",        "hidden_size",       "head_dim",      "num_query_groups", "video_in_channels",
      "audio_in_channels", "text_in_channels",  "mm_layers",     "gelu7_layers",     "enable_attn_gating",
      "norm_eps",          "deinterleave_mlp",  "fused_ops"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      fail("model.config: unknown key '", it.key(), "' for magihuman");
  auto get = [&](const char* key, auto& field) {
    if (!j.contains(key)) return;
    try {
      field = j.at(key).get<std::decay_t<decltype(field)>>();
    } catch (const nlohmann::json::exception&) {
      fail("model.config.", key, ": wrong type (", j.at(key).dump(), ")");
    }
  };
  get("num_layers", c.num_layers);
  get("hidden_size", c.hidden_size);
  get("head_dim", c.head_dim);
  get("num_query_groups", c.num_query_groups);
  get("video_in_channels", c.video_in_channels);
  get("audio_in_channels", c.audio_in_channels);
  get("text_in_channels", c.text_in_channels);
  get("mm_layers", c.mm_layers);
  get("gelu7_layers", c.gelu7_layers);
  get("enable_attn_gating", c.enable_attn_gating);
  get("norm_eps", c.norm_eps);
  get("deinterleave_mlp", c.deinterleave_mlp);
  get("fused_ops", c.fused_ops);
  if (c.num_layers < 1) fail("model.config.num_layers must be >= 1, got ", c.num_layers);
  if (c.head_dim % 8 != 0) fail("model.config.head_dim must be a multiple of 8 (RoPE bands = head_dim/8), got ", c.head_dim);
  if (c.hidden_size % c.head_dim != 0)
    fail("model.config.hidden_size ", c.hidden_size, " is not a multiple of head_dim ", c.head_dim);
  if (c.num_heads_q() % c.num_query_groups != 0)
    fail("model.config: ", c.num_heads_q(), " query heads are not a multiple of num_query_groups ", c.num_query_groups);
  if (c.video_in_channels % 4 != 0)
    fail("model.config.video_in_channels must be latent channels x 4 (patch 1x2x2), got ", c.video_in_channels);
  for (auto* list : {&c.mm_layers, &c.gelu7_layers})
    for (int64_t layer : *list)
      if (layer < 0 || layer >= c.num_layers)
        fail("model.config: layer index ", layer, " in mm_layers/gelu7_layers is outside 0..", c.num_layers - 1);
  return c;
}

MagiHumanConfig MagiHumanConfig::infer_from_shapes(const std::map<std::string, std::vector<int64_t>>& shapes) {
  auto shape = [&](const std::string& name) -> const std::vector<int64_t>& {
    auto it = shapes.find(name);
    if (it == shapes.end()) fail("magihuman checkpoint: missing '", name, "', cannot infer the model config");
    return it->second;
  };
  MagiHumanConfig c;
  c.hidden_size = shape("adapter.video_embedder.weight")[0];
  c.video_in_channels = shape("adapter.video_embedder.weight")[1];
  c.audio_in_channels = shape("adapter.audio_embedder.weight")[1];
  c.text_in_channels = shape("adapter.text_embedder.weight")[1];
  c.num_layers = 0;
  while (shapes.count("block.layers." + std::to_string(c.num_layers) + ".attention.linear_qkv.weight")) ++c.num_layers;
  c.mm_layers.clear();
  c.gelu7_layers.clear();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const auto p = "block.layers." + std::to_string(i) + ".";
    const int64_t experts = shape(p + "attention.pre_norm.weight")[0] / c.hidden_size;
    if (experts > 1) c.mm_layers.push_back(i);
    if (i == 0) {
      c.head_dim = shape(p + "attention.q_norm.weight")[0] / experts;
      const int64_t heads_q = c.hidden_size / c.head_dim;
      const int64_t kv_rows = shape(p + "attention.linear_qkv.weight")[0] / experts - heads_q * c.head_dim;
      c.enable_attn_gating = (kv_rows - heads_q) % (2 * c.head_dim) == 0;  // gates: one row per q head
      c.num_query_groups = (kv_rows - (c.enable_attn_gating ? heads_q : 0)) / (2 * c.head_dim);
    }
    const int64_t up_rows = shape(p + "mlp.up_gate_proj.weight")[0] / experts;
    if (up_rows == shape(p + "mlp.down_proj.weight")[1]) c.gelu7_layers.push_back(i);
  }
  for (const auto& spec : hf_tensor_specs(c))
    if (shape(spec.name) != spec.shape)
      fail("magihuman checkpoint: '", spec.name, "' has shape ", at::IntArrayRef(shape(spec.name)),
           ", but the inferred config implies ", at::IntArrayRef(spec.shape));
  return c;
}

nlohmann::json MagiHumanConfig::to_json() const {
  return {{"num_layers", num_layers},
          {"hidden_size", hidden_size},
          {"head_dim", head_dim},
          {"num_query_groups", num_query_groups},
          {"video_in_channels", video_in_channels},
          {"audio_in_channels", audio_in_channels},
          {"text_in_channels", text_in_channels},
          {"mm_layers", mm_layers},
          {"gelu7_layers", gelu7_layers},
          {"enable_attn_gating", enable_attn_gating},
          {"norm_eps", norm_eps},
          {"deinterleave_mlp", deinterleave_mlp},
          {"fused_ops", fused_ops}};
}

bool MagiHumanConfig::is_mm_layer(int64_t layer) const {
  return std::find(mm_layers.begin(), mm_layers.end(), layer) != mm_layers.end();
}

bool MagiHumanConfig::is_gelu7_layer(int64_t layer) const {
  return std::find(gelu7_layers.begin(), gelu7_layers.end(), layer) != gelu7_layers.end();
}

int64_t MagiHumanConfig::mlp_width(int64_t layer) const {
  // Upstream TransFormerLayer: GELU7 layers use 4D; SwiGLU7 layers int(4D * 2/3) rounded down to /4.
  if (is_gelu7_layer(layer)) return hidden_size * 4;
  return static_cast<int64_t>(hidden_size * 4 * 2.0 / 3.0) / 4 * 4;
}

int64_t MagiHumanConfig::up_gate_rows(int64_t layer) const {
  return is_gelu7_layer(layer) ? mlp_width(layer) : 2 * mlp_width(layer);
}

int64_t MagiHumanConfig::io_width() const {
  return std::max({video_in_channels, audio_in_channels, text_in_channels});
}

int64_t MagiHumanConfig::out_width() const { return std::max(video_in_channels, audio_in_channels); }

int64_t MagiHumanConfig::num_gated_layers() const {
  int64_t n = 0;
  for (int64_t layer = 0; layer < num_layers; ++layer) n += is_gelu7_layer(layer) ? 0 : 1;
  return n;
}

std::vector<TensorSpec> hf_tensor_specs(const MagiHumanConfig& c) {
  const auto bf16 = at::kBFloat16, f32 = at::kFloat;
  const int64_t d = c.hidden_size;
  std::vector<TensorSpec> specs = {
      {"adapter.video_embedder.weight", {d, c.video_in_channels}, bf16},
      {"adapter.video_embedder.bias", {d}, bf16},
      {"adapter.text_embedder.weight", {d, c.text_in_channels}, bf16},
      {"adapter.text_embedder.bias", {d}, bf16},
      {"adapter.audio_embedder.weight", {d, c.audio_in_channels}, bf16},
      {"adapter.audio_embedder.bias", {d}, bf16},
      {"adapter.rope.bands", {c.rope_bands()}, f32, /*trainable=*/false},
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const auto p = "block.layers." + std::to_string(i) + ".";
    const int64_t e = c.experts(i);
    specs.push_back({p + "attention.pre_norm.weight", {d * e}, f32});
    specs.push_back({p + "attention.linear_qkv.weight", {c.qkv_width() * e, d}, bf16});
    specs.push_back({p + "attention.linear_proj.weight", {d * e, d}, bf16});
    specs.push_back({p + "attention.q_norm.weight", {c.head_dim * e}, f32});
    specs.push_back({p + "attention.k_norm.weight", {c.head_dim * e}, f32});
    specs.push_back({p + "mlp.pre_norm.weight", {d * e}, f32});
    specs.push_back({p + "mlp.up_gate_proj.weight", {c.up_gate_rows(i) * e, d}, bf16});
    specs.push_back({p + "mlp.down_proj.weight", {d * e, c.mlp_width(i)}, bf16});
  }
  specs.push_back({"final_norm_video.weight", {d}, f32});
  specs.push_back({"final_norm_audio.weight", {d}, f32});
  specs.push_back({"final_linear_video.weight", {c.video_in_channels, d}, bf16});
  specs.push_back({"final_linear_audio.weight", {c.audio_in_channels, d}, bf16});
  return specs;
}

}  // namespace mmtrain::magihuman
