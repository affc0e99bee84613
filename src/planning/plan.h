// `mmtrain plan CONFIG --world-size N [--seqlen L]`: per-rank memory of a training run, computed
// from parameter shapes and the model's activation formula without allocating anything
// (fsdp/plan.h for the sharded and gathered parameter memory, the model spec's activation
// estimate for the rest). Reference: docs/tools.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set-file's, then --set's (cli/options.h)
  int world_size = 1;
  int64_t seqlen = 0;                  // tokens per sample; 0 = the model's default
  std::vector<std::string> images;     // --image H,W per image of a sample (a vision-language model)
  // The hardware (plan/step_time.h): with a device profile the plan adds the step time. nodes x
  // devices_per_node, when given, is the world; devices_per_node defaults to the whole world.
  std::string device;                  // h200, h100, a100, 910b3, or a profile's JSON path; "" = none
  int nodes = 0;
  int devices_per_node = 0;
  // --auto (planning/plan_auto.h): search the knobs under these budgets (GB; 0 = 0.9 x the
  // profile's device memory per rank and host memory per node, no limit for the disk, per node),
  // print the best `top`, write the winner's --set lines to `out`.
  bool auto_search = false;
  double device_memory_gb = 0, host_memory_gb = 0, disk_gb = 0;
  int top = 5;
  std::string out;
};

// Prints the table, then one JSON line with every figure (bytes) as the last line of stdout.
void plan_memory(const PlanOptions& options);
// --image's "H,W" values as (H, W) pixels; a malformed or non-positive one fails naming it.
std::vector<std::pair<int64_t, int64_t>> plan_images(const PlanOptions& options);

}  // namespace mmtrain
