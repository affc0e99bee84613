// What `mmtrain flops MODEL` asks a model: its forward + backward model FLOPs for a few
// representative samples, with the terms it wants shown. The tool adds what is common to every
// model (per step, TFLOP/s per device, MFU: docs/flops.md).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

struct FlopsQuery {
  std::vector<int64_t> seqlens;                        // per-sample lengths of n representative samples
  std::vector<std::pair<int64_t, int64_t>> images;     // (H, W) in pixels of every image of those samples
  std::optional<double> attention_coefficient;         // a model that takes one (MagiHuman) uses it
};

// Throughput by the seeds' convention (docs/flops.md), the one place it is written: the trainer's
// metrics, `mmtrain flops` and the models' FLOPs tools all call it.
//   tflops_per_device = flops_per_step / step_seconds / devices / 1e12
//   mfu               = tflops_per_device * 1e12 / hardware_flops   (0 when hardware_flops is 0)
struct Throughput {
  double tflops_per_device = 0;
  double mfu = 0;
};
inline Throughput throughput(double flops_per_step, double devices, double step_seconds, double hardware_flops) {
  Throughput t;
  if (step_seconds <= 0 || devices <= 0) return t;
  t.tflops_per_device = flops_per_step / step_seconds / devices / 1e12;
  if (hardware_flops > 0) t.mfu = t.tflops_per_device * 1e12 / hardware_flops;
  return t;
}

struct FlopsReport {
  std::string title;                   // first line of the summary
  std::vector<std::string> lines;      // the model's own summary lines: dimensions and terms
  nlohmann::ordered_json fields;       // the model's own JSON fields, written before the common ones
  double flops_per_sample = 0;         // forward + backward, averaged over the query's samples
  double attention_flops_per_sample = 0;  // of that, the attention scores' quadratic term (the rest
                                          // runs as GEMMs: the step-time model's split)
};

}  // namespace mmtrain
