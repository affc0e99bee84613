#include "models/magihuman/flops.h"

#include "core/error.h"
#include "models/flops_report.h"
#include "models/magihuman/model.h"

#include <ATen/ops/diff.h>

#include <algorithm>
#include <cctype>
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
  const auto model = make_magihuman(config);  // the Params live as long as the model
  for (auto& [name, param] : model->named_parameters()) tensors.emplace_back(name, param->shape);
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

double magihuman_train_flops_for_batch(const MagiHumanConfig& config, const at::Tensor& cu_seqlens,
                                       double active_linear_params) {
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
  if (active_linear_params <= 0) active_linear_params = magihuman_active_linear_params(config);
  return magihuman_model_flops(active_linear_params, config, seqlens);
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
  const auto rate = throughput(t.flops_per_step, static_cast<double>(device_num), step_time, hardware_flops);
  t.tflops_per_device = rate.tflops_per_device;
  t.mfu = rate.mfu;
  return t;
}

}  // namespace mmtrain::magihuman
