// MagiHuman model FLOPs and MFU, in the convention of MindSpeed-MM's flops_magihuman.py (the
// FLOPs tool of the seed's MagiHuman run), so our TFLOP/s and MFU are directly comparable with the
// seed's 71.8 TFLOP/s per device / 25.63 % on 8 Ascend 910B3. The CLI (`mmtrain flops magihuman`)
// and the trainer's live TFLOP/s (the model's Model::train_flops) both call this file;
// docs/flops.md has the derivation.
//
//   N (active linear params) = Σ numel over 2-D tensors; tensors of layers in mm_layers count 1/3
//       (one modality expert is active per token); adapter embedders and final heads included,
//       1-D tensors (norms, biases, rope bands) excluded. Full config: 10,933,616,640.
//   model_flops(seqlens)      = 6 · N · Σ_s s  +  c_attn · Σ_s s² · head_dim · heads_q · num_layers
//       s runs over samples (attention is block-diagonal per sample); c_attn = 7 (the seed's:
//       fwd 2 + bwd 5, inherited from causal-LM tools; full bidirectional attention is ~2x that).
//   Throughput of a run described by seqlens = lengths of n representative samples:
//       flops_per_sample   = model_flops(seqlens) / n
//       flops_per_step     = flops_per_sample · global_batch_size
//       TFLOP/s per device and MFU from it by throughput() (models/flops_report.h)
//   With seqlens = {4606}, gbs 8, 8 devices, 4.6348 s: 3.3258e14 FLOPs/sample, 71.76 TFLOP/s per
//   device, 25.63 % MFU at 2.8e14 — the seed's figures.
#pragma once
#include "models/magihuman/config.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain::magihuman {

// The seed's attention coefficient (fwd 2 + bwd 5 FLOPs per s²·d·h).
constexpr double kSeedAttentionCoefficient = 7.0;

// A checkpoint tensor as the FLOPs rule sees it: name and shape (dtype is irrelevant).
using NamedShape = std::pair<std::string, std::vector<int64_t>>;

// N for the tensors of the model config builds (its Module tree).
double magihuman_active_linear_params(const MagiHumanConfig& config);
// N for any tensor list (an HF checkpoint's headers): a tensor whose name contains
// "layers.<i>." with i in mm_layers counts numel / num_modalities. Names may carry a prefix
// ("dit.block.layers.3.…" counts like "block.layers.3.…").
double magihuman_active_linear_params(const std::vector<NamedShape>& tensors, const std::vector<int64_t>& mm_layers,
                                      int64_t num_modalities = kNumModalities);

// The two terms of model_flops, summed over the samples of seqlens.
double magihuman_linear_flops(double active_linear_params, const std::vector<int64_t>& seqlens);
double magihuman_attention_flops(const MagiHumanConfig& config, const std::vector<int64_t>& seqlens,
                                 double attention_coefficient = kSeedAttentionCoefficient);

// Forward + backward model FLOPs of the samples in seqlens (one entry per sample).
double magihuman_model_flops(const MagiHumanConfig& config, const std::vector<int64_t>& seqlens,
                             double attention_coefficient = kSeedAttentionCoefficient);
// Same with N given (e.g. read from a checkpoint); config supplies head_dim, heads and layers.
double magihuman_model_flops(double active_linear_params, const MagiHumanConfig& config,
                             const std::vector<int64_t>& seqlens,
                             double attention_coefficient = kSeedAttentionCoefficient);

// The live-trainer hook: FLOPs of one packed micro-batch, per-sample lengths taken from
// cu_seqlens [B+1] (int32/int64, cumulative, starting at 0). Model::train_flops returns this;
// the trainer sums it over ranks and micro-batches and divides by world size and step time,
// which equals tflops_per_device below when every rank sees samples of the same lengths.
// active_linear_params > 0 is N already computed for config (the model caches it); 0 computes it.
double magihuman_train_flops_for_batch(const MagiHumanConfig& config, const at::Tensor& cu_seqlens,
                                       double active_linear_params = 0);

struct MagiHumanThroughput {
  double active_linear_params = 0;
  double attention_coefficient = kSeedAttentionCoefficient;
  int64_t samples = 0;                 // n = seqlens.size()
  double linear_flops_per_sample = 0;  // 6 N Σs / n
  double attention_flops_per_sample = 0;
  double flops_per_sample = 0;         // model_flops(seqlens) / n
  double flops_per_step = 0;           // flops_per_sample * global_batch_size
  double tflops_per_device = 0;        // 0 when step_time is not given
  double mfu = 0;                      // fraction; 0 when hardware_flops is not given
};

// The CLI's numbers. step_time in seconds; step_time <= 0 or hardware_flops <= 0 leave the
// dependent figures at 0. Fails on empty seqlens, a non-positive length, gbs or device_num.
MagiHumanThroughput magihuman_throughput(double active_linear_params, const MagiHumanConfig& config,
                                         const std::vector<int64_t>& seqlens, int64_t global_batch_size,
                                         int64_t device_num, double step_time, double hardware_flops,
                                         double attention_coefficient = kSeedAttentionCoefficient);

}  // namespace mmtrain::magihuman
