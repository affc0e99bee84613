#include "models/magihuman/flops.h"

#include "core/error.h"

#include <ATen/ops/diff.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>

namespace mmtrain::magihuman {
namespace {

// The layer index of "…layers.<i>.…" (first occurrence), as flops_magihuman.py's regex
// r"layers\.(\d+)\." finds it; none for tensors outside the layer stack.
std::optional<int64_t> layer_index(const std::string& name) {
  static const std::string key = "layers.";
  for (size_t at = name.find(key); at != std::string::npos; at = name.find(key, at + 1)) {
    if (at > 0 && name[at - 1] != '.') continue;  // "xlayers.1." is not a layer
    size_t end = at + key.size();
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == at + key.size() || end >= name.size() || name[end] != '.') continue;
    return std::stoll(name.substr(at + key.size(), end - at - key.size()));
  }
  return std::nullopt;
}

void check_seqlens(const std::vector<int64_t>& seqlens, const char* where) {
  if (seqlens.empty()) fail(where, ": expected at least one sequence length, found none");
  for (size_t i = 0; i < seqlens.size(); ++i)
    if (seqlens[i] <= 0) fail(where, ": expected positive sequence lengths, found ", seqlens[i], " at position ", i);
}

}  // namespace

double magihuman_active_linear_params(const std::vector<NamedShape>& tensors, const std::vector<int64_t>& mm_layers,
                                      int64_t num_modalities) {
  if (num_modalities < 1) fail("magihuman FLOPs: num_modalities must be >= 1, found ", num_modalities);
  const std::set<int64_t> mm(mm_layers.begin(), mm_layers.end());
  double n = 0;
  for (const auto& [name, shape] : tensors) {
    if (shape.size() != 2) continue;  // norms, biases, bands: not GEMM weights
    const double numel = static_cast<double>(shape[0]) * static_cast<double>(shape[1]);
    const auto layer = layer_index(name);
    // Expert rows are contiguous per modality and each token uses exactly one expert.
    n += layer && mm.count(*layer) ? numel / num_modalities : numel;
  }
  return n;
}

double magihuman_active_linear_params(const MagiHumanConfig& config) {
  std::vector<NamedShape> tensors;
  for (const auto& spec : hf_tensor_specs(config)) tensors.emplace_back(spec.name, spec.shape);
  return magihuman_active_linear_params(tensors, config.mm_layers);
}

double magihuman_linear_flops(double active_linear_params, const std::vector<int64_t>& seqlens) {
  check_seqlens(seqlens, "magihuman FLOPs");
  double tokens = 0;
  for (int64_t s : seqlens) tokens += static_cast<double>(s);
  return 6.0 * active_linear_params * tokens;  // 2 forward + 4 backward per weight per token
}

double magihuman_attention_flops(const MagiHumanConfig& config, const std::vector<int64_t>& seqlens,
                                 double attention_coefficient) {
  check_seqlens(seqlens, "magihuman FLOPs");
  double squares = 0;
  for (int64_t s : seqlens) squares += static_cast<double>(s) * static_cast<double>(s);
  return attention_coefficient * squares * static_cast<double>(config.head_dim) *
         static_cast<double>(config.num_heads_q()) * static_cast<double>(config.num_layers);
}

double magihuman_model_flops(double active_linear_params, const MagiHumanConfig& config,
                             const std::vector<int64_t>& seqlens, double attention_coefficient) {
  return magihuman_linear_flops(active_linear_params, seqlens) +
         magihuman_attention_flops(config, seqlens, attention_coefficient);
}

double magihuman_model_flops(const MagiHumanConfig& config, const std::vector<int64_t>& seqlens,
                             double attention_coefficient) {
  return magihuman_model_flops(magihuman_active_linear_params(config), config, seqlens, attention_coefficient);
}

double magihuman_train_flops_for_batch(const MagiHumanConfig& config, const at::Tensor& cu_seqlens) {
  if (cu_seqlens.dim() != 1 || cu_seqlens.numel() < 2)
    fail("magihuman train_flops: cu_seqlens must be [B+1] with B >= 1, found shape ", cu_seqlens.sizes());
  const auto lengths = at::diff(cu_seqlens.to(at::kLong).cpu()).contiguous();
  const auto* data = lengths.data_ptr<int64_t>();
  std::vector<int64_t> seqlens;
  for (int64_t i = 0; i < lengths.numel(); ++i) {
    // Zero-length entries (padding samples) cost nothing; negative ones are a broken batch.
    if (data[i] < 0) fail("magihuman train_flops: cu_seqlens decreases at position ", i + 1);
    if (data[i] > 0) seqlens.push_back(data[i]);
  }
  if (seqlens.empty()) return 0.0;
  // N is recomputed per call: a few hundred multiplications, negligible next to a step.
  return magihuman_model_flops(config, seqlens);
}

MagiHumanThroughput magihuman_throughput(double active_linear_params, const MagiHumanConfig& config,
                                         const std::vector<int64_t>& seqlens, int64_t global_batch_size,
                                         int64_t device_num, double step_time, double hardware_flops,
                                         double attention_coefficient) {
  check_seqlens(seqlens, "magihuman throughput");
  if (global_batch_size <= 0) fail("magihuman throughput: --gbs must be positive, found ", global_batch_size);
  if (device_num <= 0) fail("magihuman throughput: --device_num must be positive, found ", device_num);
  MagiHumanThroughput t;
  t.active_linear_params = active_linear_params;
  t.attention_coefficient = attention_coefficient;
  t.samples = static_cast<int64_t>(seqlens.size());
  const double n = static_cast<double>(t.samples);
  t.linear_flops_per_sample = magihuman_linear_flops(active_linear_params, seqlens) / n;
  t.attention_flops_per_sample = magihuman_attention_flops(config, seqlens, attention_coefficient) / n;
  t.flops_per_sample = t.linear_flops_per_sample + t.attention_flops_per_sample;
  t.flops_per_step = t.flops_per_sample * static_cast<double>(global_batch_size);
  if (step_time > 0) t.tflops_per_device = t.flops_per_step / step_time / static_cast<double>(device_num) / 1e12;
  if (step_time > 0 && hardware_flops > 0) t.mfu = t.tflops_per_device * 1e12 / hardware_flops;
  return t;
}

MagiHumanConfig magihuman_config_from_tensors(const std::vector<NamedShape>& tensors) {
  std::map<std::string, std::vector<int64_t>> shapes(tensors.begin(), tensors.end());
  auto shape_of = [&](const std::string& name) -> const std::vector<int64_t>& {
    auto it = shapes.find(name);
    if (it == shapes.end())
      fail("magihuman checkpoint: expected tensor '", name, "' (HF base layout, magihuman.md §4), found none among ",
           tensors.size(), " tensors");
    return it->second;
  };
  auto dim = [&](const std::string& name, size_t d) {
    const auto& shape = shape_of(name);
    if (shape.size() <= d) fail("magihuman checkpoint: '", name, "' has ", shape.size(), " dims, expected more than ", d);
    return shape[d];
  };

  MagiHumanConfig c;
  c.hidden_size = dim("final_norm_video.weight", 0);
  c.video_in_channels = dim("adapter.video_embedder.weight", 1);
  c.audio_in_channels = dim("adapter.audio_embedder.weight", 1);
  c.text_in_channels = dim("adapter.text_embedder.weight", 1);

  std::set<int64_t> layers;
  for (const auto& [name, shape] : tensors)
    if (auto layer = layer_index(name)) layers.insert(*layer);
  if (layers.empty()) fail("magihuman checkpoint: expected block.layers.<i>.* tensors, found none");
  c.num_layers = *layers.rbegin() + 1;
  if (static_cast<int64_t>(layers.size()) != c.num_layers)
    fail("magihuman checkpoint: expected layers 0..", c.num_layers - 1, ", found only ", layers.size(), " of them");

  c.mm_layers.clear();
  c.gelu7_layers.clear();
  const int64_t d = c.hidden_size;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "block.layers." + std::to_string(i) + ".";
    const int64_t norm = dim(p + "attention.pre_norm.weight", 0);
    if (norm != d && norm != kNumModalities * d)
      fail("magihuman checkpoint: '", p, "attention.pre_norm.weight' has ", norm, " rows, expected ", d, " or ",
           kNumModalities * d);
    const int64_t experts = norm / d;
    if (experts > 1) c.mm_layers.push_back(i);
    // GELU7 layers are the non-gated ones: up_gate rows per expert == down_proj input width.
    if (dim(p + "mlp.up_gate_proj.weight", 0) / experts == dim(p + "mlp.down_proj.weight", 1)) c.gelu7_layers.push_back(i);
    if (i == 0) c.head_dim = dim(p + "attention.q_norm.weight", 0) / experts;  // q_norm is [hd·E]
  }
  if (c.head_dim <= 0 || d % c.head_dim != 0)
    fail("magihuman checkpoint: head_dim ", c.head_dim, " (from q_norm) does not divide hidden size ", d);
  // QKV rows per expert: (Hq + 2 Hkv) hd, plus Hq gate logits when gating is on.
  const int64_t e0 = c.experts(0);
  const int64_t qkv = dim("block.layers.0.attention.linear_qkv.weight", 0) / e0;
  const int64_t hq = c.num_heads_q();
  int64_t rest = qkv - hq * c.head_dim;
  c.enable_attn_gating = rest % (2 * c.head_dim) != 0;
  if (c.enable_attn_gating) rest -= hq;
  if (rest <= 0 || rest % (2 * c.head_dim) != 0)
    fail("magihuman checkpoint: linear_qkv has ", qkv, " rows per expert, which is not (", hq, " + 2·Hkv)·", c.head_dim,
         " [+ ", hq, " gate rows]");
  c.num_query_groups = rest / (2 * c.head_dim);
  return c;
}

}  // namespace mmtrain::magihuman
