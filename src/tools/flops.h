// `mmtrain flops MODEL`: offline FLOPs / TFLOP/s / MFU calculators on top of the models' own
// FLOPs functions (docs/flops.md).
//   magihuman: the seed's calculator (MindSpeed-MM flops_magihuman.py), models/magihuman/flops.h.
//     Dimensions come from an mmtrain YAML (model.config) or are read back from an HF checkpoint
//     directory's safetensors headers (no tensor data is loaded).
//   mistral3: spec magistral.md §9 (causal text attention, vision x1 when frozen), the
//     mistral3_flops_terms the trainer's live figures use; dimensions from an mmtrain YAML.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

struct FlopsOptions {
  std::string config_path;             // mmtrain YAML with model.model_id magihuman / mistral3; or
  std::vector<std::string> overrides;  //   --set overrides for it
  std::string ckpt_dir;                // magihuman: HF directory (model.safetensors[.index.json])
  std::vector<int64_t> seqlens;        // per-sample lengths of n representative samples
  std::vector<std::string> images;     // mistral3: "HxW" (pixels) of every image in those samples
  int64_t global_batch_size = 1;       // samples per optimizer step over all devices
  int64_t device_num = 1;
  double step_time = 0;                // seconds; 0 = no throughput figures
  double hardware_flops = 0;           // peak FLOP/s of one device; 0 = no MFU
  double attention_coefficient = 7.0;  // magihuman: the seed's; see docs/flops.md for the caveat
};

// Prints a human summary, then one JSON line (active_linear_params, flops_per_sample,
// tflops_per_device, mfu, ...) as the last line of stdout.
void flops_magihuman(const FlopsOptions& options);

// Prints a human summary, then one JSON line (text_flops_per_token, vision_forward_flops,
// flops_per_sample, tflops_per_device, mfu, ...) as the last line of stdout.
void flops_mistral3(const FlopsOptions& options);

}  // namespace mmtrain
