// `mmtrain flops MODEL (--config CFG | --ckpt DIR) --seqlens ...`: offline FLOPs, TFLOP/s per
// device and MFU of a run, for every model spec with a FLOPs function (docs/flops.md). The model
// gives its forward + backward FLOPs per sample and the terms it wants shown (ModelSpec::flops);
// this tool adds what every model shares:
//   flops_per_step    = flops_per_sample * global_batch_size
//   TFLOP/s per device and MFU from it by throughput() (models/flops_report.h)
// It prints a human summary, then one JSON object as the last line of stdout.
#pragma once
#include "models/flops_report.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

struct FlopsOptions {
  std::string config_path;             // mmtrain YAML whose model.model_id is the model; or
  std::vector<std::string> overrides;  //   --set overrides for it
  std::string ckpt_dir;                // HF directory the model's spec reads its config off
  std::vector<int64_t> seqlens;        // per-sample lengths of n representative samples
  std::vector<std::string> images;     // "HxW" (pixels) of every image in those samples
  int64_t global_batch_size = 1;       // samples per optimizer step over all devices
  int64_t device_num = 1;
  double step_time = 0;                // seconds; 0 = no throughput figures
  double hardware_flops = 0;           // peak FLOP/s of one device; 0 = no MFU
  std::vector<double> attention_coefficient;  // empty, or one value (a model that takes one)
};

void flops_report(const std::string& model_id, const FlopsOptions& options);

// "504x644" -> (504, 644); fails naming the tool (`flops MODEL`) and the text.
std::pair<int64_t, int64_t> parse_image_size(const std::string& tool, const std::string& text);

}  // namespace mmtrain
