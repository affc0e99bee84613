#include "models/magihuman/config.h"

#include "core/error.h"
#include "core/param_map.h"
#include "core/text.h"
#include "models/magihuman/hf_adapter.h"
#include "models/config_check.h"
#include "models/magihuman/model.h"

#include <algorithm>

namespace mmtrain::magihuman {

MagiHumanConfig MagiHumanConfig::from_json(const nlohmann::json& j) {
  MagiHumanConfig c;
  const ParamMap m(j, "model.config", "magihuman");
  m.check_known_keys({"num_layers", "hidden_size", "head_dim", "num_query_groups", "video_in_channels",
                      "audio_in_channels", "text_in_channels", "mm_layers", "gelu7_layers", "enable_attn_gating",
                      "norm_eps", "deinterleave_mlp", "fused_ops"});
  c.num_layers = m.get_int("num_layers", c.num_layers);
  c.hidden_size = m.get_int("hidden_size", c.hidden_size);
  c.head_dim = m.get_int("head_dim", c.head_dim);
  c.num_query_groups = m.get_int("num_query_groups", c.num_query_groups);
  c.video_in_channels = m.get_int("video_in_channels", c.video_in_channels);
  c.audio_in_channels = m.get_int("audio_in_channels", c.audio_in_channels);
  c.text_in_channels = m.get_int("text_in_channels", c.text_in_channels);
  c.mm_layers = m.get_int_list("mm_layers", c.mm_layers);
  c.gelu7_layers = m.get_int_list("gelu7_layers", c.gelu7_layers);
  c.enable_attn_gating = m.get_bool("enable_attn_gating", c.enable_attn_gating);
  c.norm_eps = m.get_double("norm_eps", c.norm_eps);
  c.deinterleave_mlp = m.get_bool("deinterleave_mlp", c.deinterleave_mlp);
  c.fused_ops = m.get_bool("fused_ops", c.fused_ops);
  require_at_least("num_layers", c.num_layers);
  require_at_least("hidden_size", c.hidden_size);
  require_at_least("head_dim", c.head_dim);
  require_at_least("num_query_groups", c.num_query_groups);
  require_at_least("video_in_channels", c.video_in_channels);
  require_at_least("audio_in_channels", c.audio_in_channels);
  require_at_least("text_in_channels", c.text_in_channels);
  if (!(c.norm_eps > 0)) fail("model.config.norm_eps must be > 0, got ", c.norm_eps);
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
    if (it == shapes.end())
      fail("magihuman checkpoint: expected tensor '", name, "' (the HF base layout), found none among ", shapes.size(),
           " tensors: cannot infer the model config");
    return it->second;
  };
  auto dim = [&](const std::string& name, size_t d) {
    const auto& s = shape(name);
    if (s.size() <= d) fail("magihuman checkpoint: '", name, "' has ", s.size(), " dims, expected more than ", d);
    return s[d];
  };
  MagiHumanConfig c;
  c.hidden_size = dim("adapter.video_embedder.weight", 0);
  c.video_in_channels = dim("adapter.video_embedder.weight", 1);
  c.audio_in_channels = dim("adapter.audio_embedder.weight", 1);
  c.text_in_channels = dim("adapter.text_embedder.weight", 1);
  c.num_layers = 0;
  while (shapes.count("block.layers." + std::to_string(c.num_layers) + ".attention.linear_qkv.weight")) ++c.num_layers;
  if (c.num_layers == 0) fail("magihuman checkpoint: expected block.layers.<i>.* tensors, found none");
  c.mm_layers.clear();
  c.gelu7_layers.clear();
  const int64_t d = c.hidden_size;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const auto p = "block.layers." + std::to_string(i) + ".";
    const int64_t norm = dim(p + "attention.pre_norm.weight", 0);
    if (norm != d && norm != kNumModalities * d)
      fail("magihuman checkpoint: '", p, "attention.pre_norm.weight' has ", norm, " rows, expected ", d, " or ",
           kNumModalities * d);
    const int64_t experts = norm / d;
    if (experts > 1) c.mm_layers.push_back(i);
    if (i == 0) c.head_dim = dim(p + "attention.q_norm.weight", 0) / experts;  // q_norm is [hd·E]
    // GELU7 layers are the non-gated ones: up_gate rows per expert == down_proj input width.
    if (dim(p + "mlp.up_gate_proj.weight", 0) / experts == dim(p + "mlp.down_proj.weight", 1)) c.gelu7_layers.push_back(i);
  }
  if (c.head_dim <= 0 || d % c.head_dim != 0)
    fail("magihuman checkpoint: head_dim ", c.head_dim, " (from q_norm) does not divide hidden size ", d);
  // QKV rows per expert: (Hq + 2 Hkv) hd, plus Hq gate logits when gating is on.
  const int64_t qkv = dim("block.layers.0.attention.linear_qkv.weight", 0) / c.experts(0);
  const int64_t hq = c.num_heads_q();
  int64_t rest = qkv - hq * c.head_dim;
  c.enable_attn_gating = rest % (2 * c.head_dim) != 0;
  if (c.enable_attn_gating) rest -= hq;
  if (rest <= 0 || rest % (2 * c.head_dim) != 0)
    fail("magihuman checkpoint: linear_qkv has ", qkv, " rows per expert, which is not (", hq, " + 2·Hkv)·", c.head_dim,
         " [+ ", hq, " gate rows]");
  c.num_query_groups = rest / (2 * c.head_dim);

  // The Module tree of this config must be exactly the checkpoint: same names, same shapes.
  const auto model = make_magihuman(c);
  const MagiHumanHfAdapter adapter(c);
  size_t matched = 0;
  for (auto& [name, param] : model->named_parameters()) {
    const auto key = adapter.hf_key(name);
    if (shape(key) != param->shape)
      fail("magihuman checkpoint: '", key, "' has shape ", shape_str(shape(key)), ", but the inferred config implies ",
           shape_str(param->shape));
    ++matched;
  }
  if (matched != shapes.size())
    fail("magihuman checkpoint: ", shapes.size(), " tensors, but the inferred config (", c.num_layers, " layers) has ",
         matched, ": the directory holds tensors that are not MagiHuman's");
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

}  // namespace mmtrain::magihuman
