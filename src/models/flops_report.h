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

struct FlopsReport {
  std::string title;                   // first line of the summary
  std::vector<std::string> lines;      // the model's own summary lines: dimensions and terms
  nlohmann::ordered_json fields;       // the model's own JSON fields, written before the common ones
  double flops_per_sample = 0;         // forward + backward, averaged over the query's samples
};

}  // namespace mmtrain
